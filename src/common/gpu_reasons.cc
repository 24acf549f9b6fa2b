#include "common/gpu_reasons.h"

#include <algorithm>
#include <iterator>
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

bool XidMeansHardware(std::int64_t xid) {
  // NVIDIA's Xid catalog: double-bit ECC (48), the GPU's internal
  // micro-controllers (61, 62, 119, 120), row remapping (63, 64), NVLink (74),
  // off the bus (79), high single-bit ECC rate (92), contained and
  // uncontained ECC (94, 95), unrecovered ECC (140). Xids an application
  // causes (13, 31, 43, 45: its exceptions, its page faults, its kill) are not.
  static constexpr std::int64_t kHardware[] = {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140};
  return std::find(std::begin(kHardware), std::end(kHardware), xid) != std::end(kHardware);
}

}  // namespace trainguard
