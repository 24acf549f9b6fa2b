// Fatal log lines: a line an agent matched, as it was written, against a rule
// whose scan severity is "fatal" (a GPU fallen off the bus, an uncorrectable
// ECC error, an InfiniBand port down) is a failure at once, before the rank
// exits or hangs.
#pragma once

#include <optional>
#include <string>

#include "controller/finding.h"
#include "proto/protocol.h"

namespace trainguard {

// The finding for a fatal `alert` from `node_id` (whose rank is at
// `rank_step`), or nothing for a warning.
std::optional<Finding> DetectFatalLine(const std::string& node_id, const v1::LogAlert& alert,
                                       std::int64_t rank_step, Nanos now_wall);

}  // namespace trainguard
