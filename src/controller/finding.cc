#include "controller/finding.h"

namespace trainguard {

const char* FindingKindName(FindingKind kind) {
  switch (kind) {
    case FindingKind::kRankFailed: return "rank_failed";
    case FindingKind::kHang: return "hang";
    case FindingKind::kNodeLost: return "node_lost";
    case FindingKind::kFatalLine: return "fatal_line";
    case FindingKind::kStraggler: return "straggler";
    case FindingKind::kReplicaDivergence: return "replica_divergence";
    case FindingKind::kNumericAnomaly: return "numeric_anomaly";
    case FindingKind::kLinkFlapping: return "link_flapping";
  }
  return "unknown";
}

}  // namespace trainguard
