// StragglerDetector: finds the nodes that set the job's pace, and a slow
// decline of the whole job, from per-step, per-rank phase timings.
//
// Steps are taken in windows of `window_steps`. In each window every rank
// gets the median of its per-step values; a node gets the median of its
// ranks' (a slow node slows all its ranks). A node is slow in a window when
// its value is at least `min_slowdown` above the median of all nodes AND at
// least `min_robust_z` robust deviations (1.4826 x the median absolute
// deviation of the nodes' values) above it: both a relative and a
// statistical margin, so that neither a uniform job nor a noisy window
// names anyone. Two signals are judged:
//   compute: time in forward, backward and optimizer (their device time
//            when the rank measured it), else the step minus communication;
//   communication: time in collectives and send/recv, judged only for nodes
//            whose compute is not slow (a compute straggler makes the
//            others wait in their collectives, not itself).
// Hysteresis: a node is reported after `windows_to_report` slow windows in a
// row, eligible for eviction after `windows_to_evict`, cleared after
// `windows_to_clear` normal ones. A GC pause or a checkpoint lasts a step or
// two: it moves a window's median little and never lasts several windows.
//
// Slow trend: the job's median step time per window against the median of
// its first `trend_baseline_windows` windows (of the generation); growth of
// `trend_threshold` or more for `windows_to_report` windows in a row is
// reported once, naming the phase that grew most.
//
// Pure logic: no clock, no I/O. Not thread-safe (the controller's mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace trainguard {

struct StragglerPolicy {
  int window_steps = 10;
  double min_slowdown = 0.05;     // 5 % above the median of the nodes
  double min_robust_z = 3.0;
  int windows_to_report = 2;      // 20 steps with the defaults
  int windows_to_evict = 5;       // 50 steps
  int windows_to_clear = 3;
  double trend_threshold = 0.08;  // the job's step time 8 % above its baseline
  int trend_baseline_windows = 5;
};

// One rank's step, as the detector needs it.
struct RankStep {
  std::string node;
  int rank = -1;
  std::int64_t step = 0;
  double step_us = 0;
  double compute_us = 0;
  double comm_us = 0;
  std::map<std::string, double> phases;  // totals by key (step_timing_text.h)
};

// What the compute signal counts (CPU phases; "gpu:" + these when present).
bool IsComputePhase(const std::string& key);
// compute_us and comm_us of a step from its totals.
void FillSignals(RankStep* step);

struct StragglerFinding {
  std::string kind;       // "straggler", "straggler_cleared", "slow_trend"
  std::string node;       // "" for slow_trend
  int rank = -1;          // the node's slowest rank
  std::string signal;     // "compute" or "communication"
  std::string phase;      // the phase that is slower (or grew) the most
  double slowdown = 0;    // 0.12: 12 % above the median (slow_trend: above the baseline)
  std::int64_t steps = 0;       // how many steps it has lasted
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  bool evict = false;     // "straggler": slow long enough for --straggler-action evict
  double value_us = 0;    // the node's (or job's) median per step
  double centre_us = 0;   // the median of the nodes (or the baseline)
  std::string message;
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerPolicy policy) : policy_(policy) {}

  void Add(const RankStep& step);
  // Judges every window that is complete; findings in order.
  std::vector<StragglerFinding> Evaluate();
  // A new generation: ranks and nodes may have changed; the baseline and
  // every streak start over.
  void Reset();
  // Nodes reported and not cleared.
  std::set<std::string> Stragglers() const;

 private:
  struct Window {
    std::map<int, std::vector<RankStep>> by_rank;
  };
  struct Streak {
    int slow = 0;
    int normal = 0;
    bool reported = false;
    bool evict_said = false;
    std::string signal;
    std::int64_t first_step = 0;
  };
  void Judge(std::int64_t index, const Window& w, std::vector<StragglerFinding>* out);
  void JudgeTrend(std::int64_t index, const Window& w, std::vector<StragglerFinding>* out);

  const StragglerPolicy policy_;
  std::map<std::int64_t, Window> windows_;   // by window index, not yet judged
  std::map<int, std::int64_t> rank_last_;    // each rank's newest step
  std::int64_t judged_below_ = INT64_MIN;    // windows below this index are done
  std::map<std::string, Streak> streaks_;
  std::vector<double> baseline_steps_;       // the job's window medians, first windows
  std::map<std::string, double> baseline_phases_;  // sums over the baseline windows
  std::int64_t trend_first_step_ = 0;  // the baseline's first step
  int trend_slow_ = 0;
  bool trend_said_ = false;
};

}  // namespace trainguard
