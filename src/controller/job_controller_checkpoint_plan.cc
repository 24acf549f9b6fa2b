// JobController: the checkpoint plan (checkpoint_policy.h,
// docs/checkpoint_policy.md) — sent to every node of the running generation
// when it is first made and whenever it changes by 10 % or more, and recorded.
#include <nlohmann/json.hpp>

#include "controller/job_controller.h"

namespace trainguard {

using nlohmann::json;

void JobController::MaybeSendCheckpointPlan() {
  const Nanos now = clock_->MonotonicNanos();
  checkpoints_.Begin(now);  // exposure counts from the job's first running tick
  auto send = [&](const CheckpointPlan& plan) {
    v1::ControllerMessage msg;
    v1::CheckpointPlan* m = msg.mutable_checkpoint_plan();
    m->set_memory_interval_ms(static_cast<std::int64_t>(plan.memory_interval_s * 1000));
    m->set_storage_interval_ms(static_cast<std::int64_t>(plan.storage_interval_s * 1000));
    m->set_job_mtbf_s(plan.job_mtbf_s);
    m->set_basis(plan.basis);
    for (auto& n : nodes_) {
      if (n.conn != 0 && n.group_rank >= 0) n.link->Send(msg);
    }
    plan_generation_ = generation_;
  };
  std::optional<CheckpointPlan> plan = checkpoints_.Update(now);
  if (!plan) {
    // A new generation's nodes (a replacement, a spare, agents of a
    // resumed controller) get the plan in force, recorded once already.
    if (plan_generation_ != generation_ && checkpoints_.sent()) send(*checkpoints_.sent());
    return;
  }
  send(*plan);
  json detail{{"memory_interval_s", plan->memory_interval_s},
              {"storage_interval_s", plan->storage_interval_s},
              {"job_mtbf_s", plan->job_mtbf_s},
              {"storage_mtbf_s", plan->storage_mtbf_s},
              {"save_cost_s", checkpoints_.SaveCost()},
              {"saves", checkpoints_.saves()},
              {"expected_overhead", plan->expected_overhead}};
  Emit(EventKind::kCheckpointPlan, "", -1, -1, "checkpoint plan: " + plan->basis, detail.dump());
}

}  // namespace trainguard
