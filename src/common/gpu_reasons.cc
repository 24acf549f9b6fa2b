#include "common/gpu_reasons.h"

#include <utility>

namespace trainguard {

std::vector<std::string> ThrottleReasonNames(std::int64_t mask) {
  // nvmlClocksEventReasons (formerly ClocksThrottleReasons); not idle (0x1),
  // application clocks (0x2) nor display clocks (0x100): those are settings.
  static const std::vector<std::pair<std::int64_t, const char*>> names = {
      {0x4, "sw_power_cap"},          {0x8, "hw_slowdown"},           {0x10, "sync_boost"},
      {0x20, "sw_thermal_slowdown"},  {0x40, "hw_thermal_slowdown"},  {0x80, "hw_power_brake_slowdown"}};
  std::vector<std::string> out;
  if (mask < 0) return out;
  for (const auto& [bit, name] : names) {
    if (mask & bit) out.push_back(name);
  }
  return out;
}

}  // namespace trainguard
