// What a job's checkpoint interval cost it, against the interval its
// checkpoint plan (docs/checkpoint_policy.md) or Young/Daly's optimum for
// its own figures would have: the line the downtime report prints ("every
// 30.0 min of training cost 31 % of this job; every 40 s would have cost
// about 2 %"). Pure: from the report's terms and a few counts.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace trainguard {

struct DowntimeReport;

struct CheckpointCost {
  std::int64_t saves = 0;   // checkpoints committed
  double interval_s = 0;    // step time (kept and lost) per save: the interval the job kept
  double save_share = 0;    // of the wall time, blocked in saves
  double lost_share = 0;    // of the wall time, work thrown away at failures
  double save_cost_s = 0;   // what a save blocked, on average (else the plan's figure)
  double mtbf_s = 0;        // the job's own (wall / incidents), else its plan's; 0: unknown
  std::string mtbf_from;    // "incidents" or "plan"
  double optimum_s = 0;     // Daly's optimum for save_cost_s and mtbf_s; 0: unknown
  double optimum_share = 0; // the first-order model's share at optimum_s (saves + half an interval per failure)
  double plan_interval_s = 0;  // the plan's interval to node memory (else to storage), 0: no plan
};

// `plan`: the detail of the job's newest checkpoint_plan event, or null.
// Nothing known (no save and no plan) gives saves == 0 and optimum_s == 0.
CheckpointCost ComputeCheckpointCost(const DowntimeReport& r, std::int64_t saves, int incidents,
                                     const nlohmann::json& plan);
nlohmann::json CheckpointCostJson(const CheckpointCost& c);
// "checkpoints: ..." or "" when there is nothing to say (no save).
std::string CheckpointCostLine(const CheckpointCost& c);

}  // namespace trainguard
