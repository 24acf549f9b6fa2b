#include "controller/corroboration.h"

#include <nlohmann/json.hpp>

namespace trainguard {

Corroboration Corroborate(const Blame& b, const Incident& inc, const FleetFinding& fleet,
                          const std::map<std::string, NodeSignals>& signals) {
  const Attribution& a = b.attribution;
  Corroboration c;
  c.log_only = !inc.verdict && a.answered_by == "rules" && a.action == "evict_node" && IsHardwareCategory(a.category);
  for (const auto& node : b.culprit_nodes) {
    std::vector<std::string> agree;
    // The node's own lines (its kernel's: an Xid, a link down, an I/O
    // error), not a rank's, of the verdict's kind.
    for (const auto& e : a.evidence) {
      if (e.rank < 0 && e.node == node && e.role == "cause" && IsHardwareCategory(e.category)) {
        agree.push_back("kernel: " + e.line);
      }
    }
    if (a.category == "gpu_hardware") {
      if (auto s = signals.find(node); s != signals.end()) {
        for (const auto& g : s->second.gpu_errors) agree.push_back("heartbeat: " + g);
      }
    }
    if (auto h = fleet.hardware_on_node.find(node); h != fleet.hardware_on_node.end() && h->second > 0) {
      agree.push_back("history: " + std::to_string(h->second) + " hardware incident(s) in other jobs");
    }
    if (auto w = fleet.watched_nodes.find(node); w != fleet.watched_nodes.end()) {
      agree.push_back("watched: " + w->second);
    }
    if (agree.empty()) {
      c.unsupported.push_back(node);
    } else {
      c.support[node] = std::move(agree);
    }
  }
  return c;
}

std::string Corroboration::ToJson() const {
  return nlohmann::json{{"log_only", log_only},
                        {"support", support},
                        {"unsupported", unsupported},
                        {"looked_at",
                         "the node's kernel lines, the GPU errors in its heartbeats (Xid, uncorrected ECC, row "
                         "remaps), its hardware incidents in other jobs and its watch"}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trainguard
