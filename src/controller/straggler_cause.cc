#include "controller/straggler_cause.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/stats.h"

namespace trainguard {

std::string CpuSlowCause(const std::string& node, const std::map<std::string, NodeCpu>& nodes) {
  auto own = nodes.find(node);
  if (own == nodes.end()) return "";
  std::vector<double> throttled, steal, load;
  for (const auto& [n, c] : nodes) {
    if (n == node) continue;
    if (c.throttled_pct >= 0) throttled.push_back(c.throttled_pct);
    if (c.steal_pct >= 0) steal.push_back(c.steal_pct);
    if (c.cores > 0) load.push_back(c.load1 / c.cores);
  }
  const NodeCpu& c = own->second;
  std::string cause;
  char buf[200];
  auto add = [&] { cause += (cause.empty() ? "" : "; ") + std::string(buf); };
  // Throttled 10 % of the time or more, and twice the others' (+5 points of noise).
  const double t = Median(throttled);
  if (c.throttled_pct >= 10 && c.throttled_pct >= 2 * t + 5) {
    std::snprintf(buf, sizeof(buf), "its ranks' cgroup was throttled by its CPU quota %.0f %% of the time (the "
                  "other nodes: %.0f %%)", c.throttled_pct, t);
    add();
  }
  const double s = Median(steal);
  if (c.steal_pct >= 10 && c.steal_pct >= s + 10) {
    std::snprintf(buf, sizeof(buf), "the hypervisor took %.0f %% of its CPU time (steal; the other nodes: %.0f %%)",
                  c.steal_pct, s);
    add();
  }
  const double l = Median(load);
  if (c.cores > 0 && c.load1 / c.cores >= 1.5 && c.load1 / c.cores >= 1.5 * l) {
    std::snprintf(buf, sizeof(buf), "load %.1f on %d CPUs (the other nodes: %.1f per CPU)", c.load1, c.cores, l);
    add();
  }
  return cause;
}

}  // namespace trainguard
