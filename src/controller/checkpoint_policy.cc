#include "controller/checkpoint_policy.h"

#include <algorithm>

namespace trainguard {

CheckpointPolicy::CheckpointPolicy(const JobConfig& c)
    : gpus_(std::max(1, c.nnodes * c.nproc_per_node)),
      memory_tier_(c.memory_checkpoints > 0),
      cost_prior_s_(c.checkpoint_cost_prior_s),
      memory_min_{0, c.memory_tier_min_interval_s},
      storage_min_{0, c.storage_tier_min_interval_s},
      prior_weight_(c.failure_prior_weight),
      storage_share_(c.storage_loss_prior_share),
      rate_(c.failure_prior_per_gpu_hour, c.failure_prior_weight) {
  rate_.SetPriorStorageShare(c.storage_loss_prior_share);
}

void CheckpointPolicy::Begin(Nanos now_mono) {
  if (begin_mono_ < 0) begin_mono_ = now_mono;
}

void CheckpointPolicy::ObserveSaves(std::int64_t generation, std::int64_t saves, std::int64_t blocked_us) {
  if (generation != seen_generation_) {
    if (generation < seen_generation_) return;  // an old generation's late report
    seen_generation_ = generation;
    seen_saves_ = 0;
    seen_blocked_us_ = 0;
  }
  if (saves <= seen_saves_) return;
  saves_ += saves - seen_saves_;
  blocked_us_ += std::max<std::int64_t>(0, blocked_us - seen_blocked_us_);
  seen_saves_ = saves;
  seen_blocked_us_ = std::max(seen_blocked_us_, blocked_us);
}

void CheckpointPolicy::UseFleetPrior(double per_gpu_hour, const std::string& from) {
  rate_ = FailureRateEstimate(per_gpu_hour, prior_weight_);
  rate_.SetPriorStorageShare(storage_share_);
  rate_.SetPriorSource(from);
}

void CheckpointPolicy::ObserveIncident(bool from_storage) {
  ++incidents_;
  if (from_storage) ++from_storage_;
}

double CheckpointPolicy::SaveCost() const {
  return saves_ > 0 ? static_cast<double>(blocked_us_) / 1e6 / static_cast<double>(saves_) : cost_prior_s_;
}

CheckpointPlan CheckpointPolicy::Current(Nanos now_mono) const {
  FailureRateEstimate rate = rate_;
  const double hours = begin_mono_ >= 0 ? static_cast<double>(now_mono - begin_mono_) / (3600.0 * kSecond) : 0;
  rate.Observe(hours * gpus_, incidents_, from_storage_);
  const double cost = SaveCost();
  TierCost memory = memory_min_, storage = storage_min_;
  memory.blocked_s = memory_tier_ ? cost : -1;
  storage.blocked_s = cost;
  return PlanCheckpoints(rate, gpus_, memory, storage);
}

void CheckpointPolicy::RestoreSent(const CheckpointPlan& plan, std::int64_t saves, double save_cost_s) {
  sent_ = plan;
  if (saves > 0 && save_cost_s >= 0) {
    measured_ = true;
    saves_ = saves;
    blocked_us_ = static_cast<std::int64_t>(save_cost_s * 1e6 * static_cast<double>(saves));
  }
}

std::optional<CheckpointPlan> CheckpointPolicy::Update(Nanos now_mono, Nanos every) {
  // The first measured save cost replaces the assumed one at once: the plan
  // made on the prior may be off by orders of magnitude.
  const bool first_measured = saves_ > 0 && !measured_;
  if (now_mono < next_update_mono_ && !first_measured) return std::nullopt;
  next_update_mono_ = now_mono + every;
  if (saves_ > 0) measured_ = true;
  CheckpointPlan plan = Current(now_mono);
  if (sent_ && !plan.Differs(*sent_)) return std::nullopt;
  sent_ = plan;
  return plan;
}

}  // namespace trainguard
