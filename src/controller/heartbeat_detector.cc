#include "controller/heartbeat_detector.h"
#include "common/json_text.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "controller/describe.h"

namespace trainguard {

std::vector<Finding> DetectSilentNodes(const JobView& view, const JobConfig& config) {
  std::vector<Finding> found;
  Nanos limit = config.heartbeat_interval * config.missed_heartbeats;
  for (const NodeView* n : view.nodes) {
    Nanos silent = view.now_mono - std::max(n->last_heartbeat_mono, view.silence_from_mono);
    if (silent <= limit) continue;
    Finding f;
    f.kind = FindingKind::kNodeLost;
    f.node = n->node_id;
    f.description = "no heartbeat for " + Seconds(silent) + " (limit " +
                    std::to_string(config.missed_heartbeats) + " x " +
                    Seconds(config.heartbeat_interval) + ")";
    f.fault_wall = n->last_heartbeat_wall;
    f.detail_json = nlohmann::json{{"reason", f.description}}.dump(-1, ' ', false, kReplaceBadUtf8);
    found.push_back(std::move(f));
  }
  return found;
}

}  // namespace trainguard
