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

std::string NetworkSlowCause(const std::string& node, const std::map<std::string, NodeNet>& nodes) {
  auto own = nodes.find(node);
  if (own == nodes.end()) return "";
  std::vector<double> retrans, errors;
  for (const auto& [n, net] : nodes) {
    if (n == node) continue;
    if (net.tcp_retrans_pct >= 0) retrans.push_back(net.tcp_retrans_pct);
    if (net.errors_per_s >= 0) errors.push_back(net.errors_per_s);
  }
  const NodeNet& c = own->second;
  std::string cause;
  char buf[256];
  auto add = [&] { cause += (cause.empty() ? "" : "; ") + std::string(buf); };
  // 1 % of its segments or more, and three times the others' (+0.5 point):
  // a healthy fabric retransmits well under 0.1 %.
  const double r = Median(retrans);
  if (!retrans.empty() && c.tcp_retrans_pct >= 1 && c.tcp_retrans_pct >= 3 * r + 0.5) {
    std::snprintf(buf, sizeof(buf), "TCP retransmitted %.1f %% of its segments (the other nodes: %.1f %%)",
                  c.tcp_retrans_pct, r);
    add();
  }
  const double e = Median(errors);
  if (!errors.empty() && c.errors_per_s >= 1 && c.errors_per_s >= 10 * e + 1) {
    std::snprintf(buf, sizeof(buf), "its links dropped or errored %.0f packets/s (the other nodes: %.0f)",
                  c.errors_per_s, e);
    add();
  }
  if (c.flaps > 0) {
    std::snprintf(buf, sizeof(buf), "its links lost their carrier %d time(s) lately", c.flaps);
    add();
  }
  return cause;
}

}  // namespace trainguard
