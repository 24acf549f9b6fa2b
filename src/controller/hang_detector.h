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

#include <cstdint>
#include <optional>

#include "controller/finding.h"
#include "controller/job_config.h"
#include "controller/job_view.h"

namespace trainguard {

// The hang timeout in force: config.hang_timeout, or with
// hang_timeout_auto the multiple of the slowest step any rank reported (at
// least the floor), or startup_timeout while no rank has timed a step yet.
Nanos EffectiveHangTimeout(const JobView& view, const JobConfig& config);

// A hang finding describes (evidence, lines, stacks to capture) the culprit
// and at most this many ranks in all; hung_ranks lists every one.
constexpr std::size_t kHungRanksDescribed = 64;
// How a hang finding's description names its culprit (replaced when the
// journals locate the hang).
constexpr const char* kHangCulprit = "; culprit: ";
constexpr const char* kHangNoCulprit = "; no rank stands out yet (";

// The hang finding, or nothing. Its rank is the likeliest culprit: a stopped
// process (state T) first, then a quiet rank over a busy one, then the rank
// that stopped progressing first. O(ranks). With `next_check`, also the
// earliest monotonic time at which the answer could turn into a hang if
// nothing new is reported (see HangDeadline): a caller need not ask before.
std::optional<Finding> DetectHang(const JobView& view, const JobConfig& config, Nanos* next_check = nullptr);

// Never: a rank that cannot hang without a new report (not running, or not
// attached and not sampled).
constexpr Nanos kNoHangDeadline = INT64_MAX;

// The earliest monotonic time after which this rank alone makes DetectHang
// find a hang, with a timeout of `timeout` (startup_timeout before its
// first step), if nothing new is reported of it: when it is stuck and, by
// then, quiet or waiting in an operation for the timeout. A larger timeout
// only moves it later, so a lower bound of the timeout gives a safe (early)
// time. O(its operations in flight): the controller keeps the earliest as
// reports arrive and runs DetectHang only once it has passed.
Nanos HangDeadline(const RankView& rank, Nanos timeout, const JobConfig& config);

// The lowest timeout EffectiveHangTimeout can give under `config`.
Nanos LowestHangTimeout(const JobConfig& config);

}  // namespace trainguard
