// How often a job should checkpoint, to each tier, for the failure rate it
// sees and what its saves cost (docs/checkpoint_policy.md). Pure: the
// controller feeds it incidents, exposure and measured save costs, and
// sends the plan to the ranks; the simulator runs the same unit.
//
// Two tiers: node memory (each node keeps its ranks' newest save and pushes
// it to its peer's memory) and storage. A failure is restored from memory
// unless a shard's both memory copies are gone (the node and its peer lost
// together, or a rollback past the newest copy): only those losses need
// storage, so the storage tier's interval is set by their rate alone.
//
// The interval of a tier is Daly's optimum ("A higher order estimate of the
// optimum checkpoint interval for restart dumps", FGCS 22(3), 2006):
//   τ = √(2δM)·[1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)] − δ   for δ < 2M, else M,
// δ the save's cost (the time it blocks training), M the mean time between
// the failures it protects against; never shorter than the tier can write.
#pragma once

#include <cstdint>
#include <string>

namespace trainguard {

// Daly's optimum interval (seconds of work between saves) for a save that
// costs `cost_s` and failures every `mtbf_s` on average.
double OptimalCheckpointInterval(double cost_s, double mtbf_s);

// Expected share of wall time lost to saving every `interval_s` (cost
// `cost_s` each) and to redoing, at each failure (every `mtbf_s`), half an
// interval of work plus `per_failure_s` (detection, shutdown, restart) —
// the first-order model Young and Daly optimize.
double CheckpointOverhead(double interval_s, double cost_s, double mtbf_s, double per_failure_s);

// The job's failure rate: a Gamma prior (a rate per GPU-hour, worth
// `prior_failures` observed failures) updated with the job's own incidents
// over its GPU-hours. The posterior mean is the estimate.
class FailureRateEstimate {
 public:
  FailureRateEstimate(double prior_per_gpu_hour, double prior_failures);
  // The job's totals so far (not increments).
  void Observe(double gpu_hours, std::int64_t incidents, std::int64_t storage_losses);
  double PerGpuHour() const;
  // Of the failures, the share that lost both memory copies of a shard (the
  // prior's share, worth as much as the rate's prior, updated with the job's).
  double StorageLossShare() const;
  void SetPriorStorageShare(double share) { prior_storage_share_ = share; }
  // Where the prior comes from, for the plan's basis ("" = said nowhere).
  void SetPriorSource(std::string from) { prior_from_ = std::move(from); }
  const std::string& prior_source() const { return prior_from_; }
  double prior_per_gpu_hour() const { return prior_rate_; }
  double gpu_hours() const { return gpu_hours_; }
  std::int64_t incidents() const { return incidents_; }

 private:
  double prior_rate_;
  double prior_failures_;
  double prior_storage_share_ = 0.02;
  std::string prior_from_;
  double gpu_hours_ = 0;
  std::int64_t incidents_ = 0;
  std::int64_t storage_losses_ = 0;
};

// What one save to a tier costs, as measured (or assumed before any save).
struct TierCost {
  double blocked_s = 0;       // training blocked per save
  double min_interval_s = 0;  // the tier writes no faster (the previous save's write must end)
};

struct CheckpointPlan {
  double memory_interval_s = 0;   // 0: no memory tier (every save goes to storage)
  double storage_interval_s = 0;
  double job_mtbf_s = 0;          // every failure
  double storage_mtbf_s = 0;      // failures that need storage
  double expected_overhead = 0;   // saves + half an interval of lost work per failure, share of wall time
  // "MTBF 18.2 min (prior 0.034 per 1000 GPU-hours, 3 incidents in 412 GPU-hours); memory every 19 s
  // (a save blocks 0.159 s), storage every 131 s (2.0 % of failures need it)"
  std::string basis;
  // Whether `other` differs enough to be sent again (an interval by 10 % or more).
  bool Differs(const CheckpointPlan& other) const;
};

// The plan for a job of `gpus` GPUs. Without a memory tier (memory.blocked_s
// < 0) every failure restores from storage, and the storage tier is planned
// for the whole failure rate.
CheckpointPlan PlanCheckpoints(const FailureRateEstimate& rate, int gpus, const TierCost& memory,
                               const TierCost& storage);

}  // namespace trainguard
