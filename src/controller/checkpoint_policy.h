// The controller's checkpoint plan for one job (checkpoint_planner.h):
// what it has seen of the job's failures and of its saves' cost, and the
// plan it last told the ranks. Logic only: the controller calls it under its
// lock, sends what Update returns and records it.
#pragma once

#include <cstdint>
#include <optional>

#include "common/clock.h"
#include "controller/checkpoint_planner.h"
#include "controller/job_config.h"

namespace trainguard {

class CheckpointPolicy {
 public:
  explicit CheckpointPolicy(const JobConfig& config);

  // The job began holding its GPUs.
  void Begin(Nanos now_mono);
  // A rank's cumulative saves and blocked time in its process (one rank of
  // the job is enough: ranks save together). A new generation's process
  // starts from zero.
  void ObserveSaves(std::int64_t generation, std::int64_t saves, std::int64_t blocked_us);
  // An incident the job restarted from; `from_storage`: it resumed from an
  // older checkpoint than the newest committed one (a shard's memory copies were gone).
  void ObserveIncident(bool from_storage);
  // The prior from the fleet's history (fleet_failure_rate.h), said as `from`.
  void UseFleetPrior(double per_gpu_hour, const std::string& from);

  // The plan to send now: the first, or one that differs from the last
  // sent by 10 % or more; nullopt otherwise. At most once per `every`, but
  // at once when the first save's cost has just been measured.
  std::optional<CheckpointPlan> Update(Nanos now_mono, Nanos every = 60 * kSecond);
  // The plan as it stands (for the report and the API).
  CheckpointPlan Current(Nanos now_mono) const;
  // The plan last sent, if any: a new generation's nodes get it again.
  const std::optional<CheckpointPlan>& sent() const { return sent_; }
  // A controller that resumes the job (Resume): the last plan it recorded
  // and the saves it rested on, so that the same plan is not sent and
  // recorded again; incidents are replayed with ObserveIncident.
  void RestoreSent(const CheckpointPlan& plan, std::int64_t saves, double save_cost_s);
  // What a save blocks, measured (or assumed before any).
  double SaveCost() const;
  std::int64_t saves() const { return saves_; }

 private:
  const int gpus_;
  const bool memory_tier_;
  const double cost_prior_s_;
  const TierCost memory_min_, storage_min_;
  const double prior_weight_, storage_share_;
  FailureRateEstimate rate_;
  Nanos begin_mono_ = -1;
  std::int64_t incidents_ = 0, from_storage_ = 0;
  // The totals over the job, and the process counters last seen.
  std::int64_t saves_ = 0, blocked_us_ = 0;
  std::int64_t seen_generation_ = -1, seen_saves_ = 0, seen_blocked_us_ = 0;
  std::optional<CheckpointPlan> sent_;
  Nanos next_update_mono_ = 0;
  bool measured_ = false;  // a plan rested on a measured save cost
};

}  // namespace trainguard
