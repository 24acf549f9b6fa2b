#include "store/node_cordon.h"

namespace trainguard {

StatusOr<NodeHealth> CordonNodeInStore(EventStore* store, const std::string& node, const std::string& by,
                                       const std::string& reason, Nanos now) {
  if (node.empty()) return InvalidArgument("cordon: the node id is empty");
  if (reason.find_first_not_of(" \t") == std::string::npos) {
    return InvalidArgument("cordon: say why (a reason is kept with the node)");
  }
  auto health = store->GetNodeHealth(node);
  if (!health.ok()) return health.status();
  if (Status s = store->RecordNodeAction({node, now, "cordon", by, reason, "", "{}"}); !s.ok()) return s;
  if (Status s = store->SetNodeHealth({node, "cordoned", reason, "", now}); !s.ok()) return s;
  return health;
}

StatusOr<NodeHealth> UncordonNodeInStore(EventStore* store, const std::string& node, const std::string& by,
                                         const std::string& reason, Nanos now) {
  auto health = store->GetNodeHealth(node);
  if (!health.ok()) return health.status();
  auto incidents = store->IncidentsOnNode(node);
  if (!incidents.ok()) return incidents.status();
  if (health->status.empty() && incidents->empty()) return NotFound("node " + node + " has no record in the store");
  const std::string was = health->status.empty() ? "ok" : health->status;
  const std::string why = reason.empty() ? "cleared by an operator" : reason;
  if (Status s = store->RecordNodeAction({node, now, "uncordon", by, why, "", "{}"}); !s.ok()) return s;
  Status s = store->SetNodeHealth(
      {node, "ok", why + " (was " + was + (health->reason.empty() ? "" : ": " + health->reason) + ")", "", now});
  if (!s.ok()) return s;
  return health;
}

}  // namespace trainguard
