#include "controller/gpu_health.h"

#include <algorithm>
#include <cstdio>

#include "common/gpu_reasons.h"

namespace trainguard {

std::vector<std::string> GpuErrorIncreases(const std::vector<v1::GpuHealth>& before,
                                           const std::vector<v1::GpuHealth>& now) {
  std::map<int, const v1::GpuHealth*> old;
  for (const auto& g : before) old[g.index()] = &g;
  std::vector<std::string> out;
  for (const auto& g : now) {
    auto it = old.find(g.index());
    if (it == old.end()) continue;
    const v1::GpuHealth& b = *it->second;
    auto grew = [&](std::int64_t was, std::int64_t is, const char* what) {
      if (was >= 0 && is > was) {
        out.push_back("GPU " + std::to_string(g.index()) + ": " + what + " " + std::to_string(was) + " -> " +
                      std::to_string(is));
      }
    };
    grew(b.ecc_uncorrected(), g.ecc_uncorrected(), "uncorrected ECC errors");
    grew(b.remapped_rows_pending(), g.remapped_rows_pending(), "row remaps pending");
    grew(b.remapped_rows_failed(), g.remapped_rows_failed(), "failed row remaps");
    if (b.xid_events() >= 0 && g.xid_events() > b.xid_events() && XidMeansHardware(g.last_xid())) {
      out.push_back("GPU " + std::to_string(g.index()) + ": Xid " + std::to_string(g.last_xid()) + " (" +
                    std::to_string(g.xid_events() - b.xid_events()) + " new)");
    }
  }
  return out;
}

std::string GpuSlowCause(const std::string& node, const std::map<std::string, std::vector<v1::GpuHealth>>& gpus) {
  std::vector<double> others;
  for (const auto& [n, list] : gpus) {
    if (n == node) continue;
    for (const auto& g : list) {
      if (g.sm_clock_mhz() > 0) others.push_back(g.sm_clock_mhz());
    }
  }
  auto own = gpus.find(node);
  if (own == gpus.end() || others.empty()) return "";
  std::nth_element(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(others.size() / 2), others.end());
  const double median = others[others.size() / 2];
  std::string cause;
  for (const auto& g : own->second) {
    std::vector<std::string> reasons = ThrottleReasonNames(g.throttle_reasons());
    if (reasons.empty() || g.sm_clock_mhz() <= 0 || g.sm_clock_mhz() > 0.95 * median) continue;
    std::string why;
    for (const auto& r : reasons) why += (why.empty() ? "" : ", ") + r;
    char buf[200];
    std::snprintf(buf, sizeof(buf), "GPU %d held down by %s at %.0f MHz (the other nodes' GPUs: %.0f MHz)", g.index(),
                  why.c_str(), g.sm_clock_mhz(), median);
    cause += (cause.empty() ? "" : "; ") + std::string(buf);
  }
  return cause;
}

}  // namespace trainguard
