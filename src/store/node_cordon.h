// Cordoning a node in the store: the one way `trainguard cordon`/`uncordon`
// and the HTTP API's actions take a node out of every job and return it.
// The action is kept in the node's history with who took it and why.
#pragma once

#include <string>

#include "store/event_store.h"

namespace trainguard {

// Cordons `node` (no job gives it ranks until uncordoned; a running job
// evicts it at its next tick). Returns the node's record as it was.
// InvalidArgument if the node id is empty or the reason blank.
StatusOr<NodeHealth> CordonNodeInStore(EventStore* store, const std::string& node, const std::string& by,
                                       const std::string& reason, Nanos now);

// Returns a cordoned (or suspect) node: status "ok", with the reason and what
// it was. NotFound if the store knows nothing of the node. Returns the record
// as it was.
StatusOr<NodeHealth> UncordonNodeInStore(EventStore* store, const std::string& node, const std::string& by,
                                         const std::string& reason, Nanos now);

}  // namespace trainguard
