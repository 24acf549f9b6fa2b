// Why a straggler is slow, where its node's telemetry shows it against the
// other nodes': its CPUs (a cgroup CPU quota throttling the ranks, the
// hypervisor's steal, more runnable work than CPUs), its network (TCP
// retransmissions, link errors and drops, carrier losses). The GPUs' part is in
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

// A node's network as its latest heartbeats show it (-1: unknown).
struct NodeNet {
  double tcp_retrans_pct = -1;  // share of TCP segments sent that were retransmissions
  double errors_per_s = -1;     // its links' rx/tx errors and drops per second
  int flaps = 0;                // its links' carrier losses within the flap window
};

// Why a communication straggler is slow, where its network stands out from
// the other nodes': "TCP retransmitted 6.8 % of its segments (the other
// nodes: 0.0 %)", link errors or drops, carrier losses; joined by "; ";
// "" when nothing stands out (then the slowness is the network's path or a
// peer's, which the node's own counters do not show).
std::string NetworkSlowCause(const std::string& node, const std::map<std::string, NodeNet>& nodes);

}  // namespace trainguard
