// Crash detection: a rank of the running generation that exited non-zero or
// was killed is a failure at once.
#pragma once

#include <optional>
#include <string>

#include "controller/finding.h"
#include "proto/protocol.h"

namespace trainguard {

// The finding for `exited` (a rank of the current generation on `node_id`),
// or nothing when it exited 0. `now_wall` dates the fault when the agent did
// not say when the rank exited.
std::optional<Finding> DetectCrash(const std::string& node_id, const v1::RankExited& exited,
                                   Nanos now_wall);

// When the rank failed, for telling which of several ranks failed first: its
// last words when the agent saw some shortly before the exit, else its exit
// (0 when neither is known). The exit itself is no order: a rank that dies
// of its own error tears down for a while, and its peers learn of the death
// and exit during that teardown, often before it ends.
Nanos FailedAt(const v1::RankExited& exited);

}  // namespace trainguard
