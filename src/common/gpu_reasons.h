// NVML's clocks-event (throttle) reasons by name, and which Xids blame the
// GPU: agent, diagnostics and controller.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainguard {

// The reasons in NVML's bit mask that slow a busy GPU down ("hw_thermal_slowdown",
// "sw_power_cap", ...); idle and application or display clock settings are
// left out. None for a negative (unknown) mask.
std::vector<std::string> ThrottleReasonNames(std::int64_t mask);

// Whether an Xid points at the GPU or its links rather than the application.
bool XidMeansHardware(std::int64_t xid);

}  // namespace trainguard
