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

}  // namespace trainguard
