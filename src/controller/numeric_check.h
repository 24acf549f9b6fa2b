// NumericCheck: compares the ranks' numeric sentinels (docs/sdc.md). Each
// rank reports its process's first NaN/Inf (of its loss or of the gradient
// norm the script computes) and its first spike, with the step. The first
// step any rank flagged is judged once it is complete: every rank has
// either flagged at or before it or finished it; or a
// grace time after it was first seen. A rank not heard from since before the
// step is waited for: until it has passed the step, whether it checks a loss
// at all is not known. Flagged by every such rank: a numeric
// problem of the job. By some only: those ranks are suspect (their device,
// or their share of the data: a replay tells, docs/sdc.md).
//
// Memory: a few numbers per rank (bounded by the world size). A judgement
// scans the ranks once, and only while an anomaly is pending, at most every
// kScanEvery. Not thread-safe (the controller's thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace trainguard {

struct NumericFinding {
  bool spike = false;          // spikes; else NaN/Inf
  std::int64_t step = -1;      // the first step flagged
  std::map<int, std::pair<int, double>> flagged;  // rank -> (kind, value) at `step`
  int observers = 0;           // ranks that check their losses
  bool all = false;            // every observer flagged at `step`
  std::vector<int> Ranks() const;
};

class NumericCheck {
 public:
  static constexpr Nanos kScanEvery = 200 * kMillisecond;
  static constexpr Nanos kGrace = 10 * kSecond;  // a rank that neither flags nor steps is not waited for longer

  // A new generation: nothing kept, nothing reported.
  void Reset(int world_size);
  // A rank's report: its step, how many losses it checked, its anomalies (kind 0: none).
  void Observe(int rank, std::int64_t step, std::int64_t losses_observed);
  void Flag(int rank, bool spike, std::int64_t step, int kind, double value);
  // Judged findings not yet returned (each of NaN/Inf and spike once per generation).
  std::vector<NumericFinding> Evaluate(Nanos now);
  // Through which step every rank is known to be free of NaN/Inf: the
  // lowest step of all ranks (capped below the first flagged step); -1 when
  // no rank has stepped or some rank never reported.
  std::int64_t CleanThrough() const;
  // Whether every rank finished `step` with no NaN/Inf at or before it (and some checks a loss).
  bool PassedClean(std::int64_t step, Nanos now);

 private:
  struct Rank {
    std::int64_t step = -1;
    bool observer = false;
    std::int64_t flag_step[2] = {-1, -1};  // [NaN/Inf, spike]
    int kind[2] = {0, 0};
    double value[2] = {0, 0};
  };
  struct Pending {
    std::int64_t step = -1;  // the lowest flagged step, -1: none
    Nanos first_seen = 0;
    bool reported = false;
  };
  std::optional<NumericFinding> Judge(int which, Nanos now);

  std::vector<Rank> ranks_;
  // The lowest step of all ranks and how many are at it; recomputed when
  // the last of those moves on.
  mutable std::int64_t min_step_ = -1;
  mutable std::int64_t at_min_ = 0;
  mutable bool min_dirty_ = true;
  Pending pending_[2];
  Nanos last_scan_[2] = {0, 0};
  Nanos last_pass_scan_ = 0;
};

}  // namespace trainguard
