// Why a straggler is slow, where its node's telemetry shows it against the
// other nodes': its CPUs (a cgroup CPU quota throttling the ranks, the
// hypervisor's steal, more runnable work than CPUs). The GPUs' part is in
// controller/gpu_health.h. Pure logic: figures in, a phrase out.
#pragma once

#include <map>
#include <string>

namespace trainguard {

struct NodeCpu {
  double throttled_pct = -1;  // -1: unknown
  double steal_pct = -1;
  double load1 = 0;
  int cores = 0;
};

// "its ranks' cgroup was throttled by its CPU quota 48 % of the time (the
// other nodes: 0 %)", several causes joined by "; "; "" when the node's CPU
// figures do not stand out from the other nodes'.
std::string CpuSlowCause(const std::string& node, const std::map<std::string, NodeCpu>& nodes);

}  // namespace trainguard
