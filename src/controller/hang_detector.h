// Hang and stall detection from heartbeats.
//
// A rank without progress (its step did not advance; for a rank that reports
// no steps, nothing moved at all) for the hang timeout is part of a hang
// finding, but the job counts as hung only once one of those ranks has also
// been quiet that long (no CPU above the agent's floor and no bytes through
// any descriptor), or one has had a communication operation in flight that
// long (its journal says so; NCCL's waiters spin, so they are never quiet).
// A long step that keeps computing is not a stall.
#pragma once

#include <optional>

#include "controller/finding.h"
#include "controller/job_config.h"
#include "controller/job_view.h"

namespace trainguard {

// The hang timeout in force: config.hang_timeout, or with
// hang_timeout_auto the multiple of the slowest step any rank reported (at
// least the floor), or startup_timeout while no rank has timed a step yet.
Nanos EffectiveHangTimeout(const JobView& view, const JobConfig& config);

// The hang finding, or nothing. Its rank is the likeliest culprit: a stopped
// process (state T) first, then a quiet rank over a busy one, then the rank
// that stopped progressing first. O(ranks).
std::optional<Finding> DetectHang(const JobView& view, const JobConfig& config);

}  // namespace trainguard
