// Corroboration: before a node is evicted on what its ranks printed, what
// the node itself says. A hardware verdict read from log lines alone (a
// bare CUDA "unspecified launch failure", an ECC error a library printed)
// stands for the node when its own signals agree: a kernel line of the same
// kind from that node, a GPU error its heartbeats showed (an Xid, an
// uncorrected ECC error, a row remap), or its history in other jobs.
// Nothing agreeing, the node is a suspect: diagnosed, and evicted on the
// diagnosis or when the same GPU fails again later (recovery_policy.h).
// Pure logic.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/fleet_history.h"
#include "controller/incident.h"
#include "controller/recovery_policy.h"

namespace trainguard {

// The confidence a log's hardware verdict is given when the node's own
// signals agree with it: a floor, assumed (two independent sources naming
// the same fault), not measured on labelled incidents.
inline constexpr double kCorroboratedConfidence = 0.95;

// What the controller knows of a node apart from its ranks' output.
struct NodeSignals {
  // GPU error increases its heartbeats showed within the suspicion window,
  // oldest first ("GPU 3: Xid 79 (1 new)", gpu_health.h).
  std::vector<std::string> gpu_errors;
};

struct Corroboration {
  // The verdict would evict on its rules' reading of log lines alone (not a
  // detector's measurement, not the model).
  bool log_only = false;
  // Culprit node -> what of its own agrees ("kernel: ...", "heartbeat: ...",
  // "history: ...").
  std::map<std::string, std::vector<std::string>> support;
  std::vector<std::string> unsupported;  // culprit nodes nothing of their own agrees with
  // {"log_only": B, "support": {node: [..]}, "unsupported": [..], "looked_at": "..."}
  std::string ToJson() const;
};

// What the nodes named by `blame` say of its attribution. `signals`: per
// node (nodes not listed have none).
Corroboration Corroborate(const Blame& blame, const Incident& inc, const FleetFinding& fleet,
                          const std::map<std::string, NodeSignals>& signals);

}  // namespace trainguard
