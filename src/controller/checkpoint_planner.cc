#include "controller/checkpoint_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace trainguard {

double OptimalCheckpointInterval(double cost_s, double mtbf_s) {
  if (!(mtbf_s > 0)) return 0;
  if (!(cost_s > 0)) return 0;  // a free save: as often as the tier can write
  if (cost_s >= 2 * mtbf_s) return mtbf_s;
  const double x = cost_s / (2 * mtbf_s);
  return std::sqrt(2 * cost_s * mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - cost_s;
}

double CheckpointOverhead(double interval_s, double cost_s, double mtbf_s, double per_failure_s) {
  if (!(interval_s > 0) || !(mtbf_s > 0)) return 1;
  const double saving = cost_s / (interval_s + cost_s);
  const double per_failure = (interval_s + cost_s) / 2 + per_failure_s;
  return std::min(1.0, saving + per_failure / mtbf_s);
}

FailureRateEstimate::FailureRateEstimate(double prior_per_gpu_hour, double prior_failures)
    : prior_rate_(prior_per_gpu_hour), prior_failures_(std::max(prior_failures, 1e-9)) {}

void FailureRateEstimate::Observe(double gpu_hours, std::int64_t incidents, std::int64_t storage_losses) {
  gpu_hours_ = std::max(0.0, gpu_hours);
  incidents_ = std::max<std::int64_t>(0, incidents);
  storage_losses_ = std::clamp<std::int64_t>(storage_losses, 0, incidents_);
}

double FailureRateEstimate::PerGpuHour() const {
  if (!(prior_rate_ > 0)) return gpu_hours_ > 0 ? static_cast<double>(incidents_) / gpu_hours_ : 0;
  // Gamma(α = prior_failures, β = prior_failures / prior_rate) updated with
  // n failures over an exposure E: the mean (α + n) / (β + E).
  return (prior_failures_ + static_cast<double>(incidents_)) / (prior_failures_ / prior_rate_ + gpu_hours_);
}

double FailureRateEstimate::StorageLossShare() const {
  // Beta prior worth prior_failures incidents, centred on the prior share.
  const double a = prior_storage_share_ * prior_failures_ + static_cast<double>(storage_losses_);
  return a / (prior_failures_ + static_cast<double>(incidents_));
}

bool CheckpointPlan::Differs(const CheckpointPlan& o) const {
  auto apart = [](double a, double b) {
    if (a == b) return false;
    if (a <= 0 || b <= 0) return true;
    return std::abs(a - b) >= 0.1 * std::min(a, b);
  };
  return apart(memory_interval_s, o.memory_interval_s) || apart(storage_interval_s, o.storage_interval_s);
}

namespace {

std::string Duration(double s) {
  char buf[32];
  if (s >= 5400) {
    std::snprintf(buf, sizeof(buf), "%.1f h", s / 3600);
  } else if (s >= 120) {
    std::snprintf(buf, sizeof(buf), "%.1f min", s / 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f s", s);
  }
  return buf;
}

}  // namespace

CheckpointPlan PlanCheckpoints(const FailureRateEstimate& rate, int gpus, const TierCost& memory,
                               const TierCost& storage) {
  CheckpointPlan plan;
  const double per_s = rate.PerGpuHour() * std::max(gpus, 1) / 3600;
  plan.job_mtbf_s = per_s > 0 ? 1 / per_s : 0;
  const bool tiers = memory.blocked_s >= 0;
  const double share = tiers ? std::clamp(rate.StorageLossShare(), 1e-6, 1.0) : 1.0;
  plan.storage_mtbf_s = per_s > 0 ? 1 / (per_s * share) : 0;
  char buf[768];
  const std::string from = rate.prior_source().empty() ? "" : ", from " + rate.prior_source();
  if (plan.job_mtbf_s <= 0) {
    plan.storage_interval_s = storage.min_interval_s;
    plan.basis = "no failure rate to plan for";
    return plan;
  }
  // A storage save is costed as a whole save: it blocks as one when it is one.
  plan.storage_interval_s =
      std::max(storage.min_interval_s, OptimalCheckpointInterval(storage.blocked_s, plan.storage_mtbf_s));
  if (tiers) {
    plan.memory_interval_s =
        std::max(memory.min_interval_s, OptimalCheckpointInterval(memory.blocked_s, plan.job_mtbf_s));
    // The memory tier protects against every failure but the storage ones;
    // those lose what storage had not saved.
    plan.expected_overhead =
        CheckpointOverhead(plan.memory_interval_s, memory.blocked_s, plan.job_mtbf_s / (1 - share), 0) +
        CheckpointOverhead(plan.storage_interval_s, 0, plan.storage_mtbf_s, 0);
    std::snprintf(buf, sizeof(buf),
                  "MTBF %s (prior %.3g failures per 1000 GPU-hours%s, %lld incident(s) in %.0f GPU-hours); memory every "
                  "%s (a save blocks %.3f s), storage every %s (%.1f %% of failures need it)",
                  Duration(plan.job_mtbf_s).c_str(), rate.prior_per_gpu_hour() * 1000, from.c_str(),
                  static_cast<long long>(rate.incidents()), rate.gpu_hours(), Duration(plan.memory_interval_s).c_str(),
                  memory.blocked_s, Duration(plan.storage_interval_s).c_str(), share * 100);
  } else {
    plan.expected_overhead =
        CheckpointOverhead(plan.storage_interval_s, storage.blocked_s, plan.storage_mtbf_s, 0);
    std::snprintf(buf, sizeof(buf),
                  "MTBF %s (prior %.3g failures per 1000 GPU-hours%s, %lld incident(s) in %.0f GPU-hours); storage every "
                  "%s (a save blocks %.3f s)",
                  Duration(plan.job_mtbf_s).c_str(), rate.prior_per_gpu_hour() * 1000, from.c_str(),
                  static_cast<long long>(rate.incidents()), rate.gpu_hours(), Duration(plan.storage_interval_s).c_str(),
                  storage.blocked_s);
  }
  plan.basis = buf;
  return plan;
}

}  // namespace trainguard
