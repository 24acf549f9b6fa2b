#include "report/checkpoint_cost.h"

#include <cstdio>

#include "controller/checkpoint_planner.h"
#include "report/downtime_report.h"

namespace trainguard {

using nlohmann::json;

namespace {

// "0.25 s", "45.0 s", "12.5 min", "3.2 h".
std::string Span(double s) {
  char buf[32];
  if (s < 10) {
    std::snprintf(buf, sizeof(buf), "%.2f s", s);
  } else if (s < 120) {
    std::snprintf(buf, sizeof(buf), "%.1f s", s);
  } else if (s < 7200) {
    std::snprintf(buf, sizeof(buf), "%.1f min", s / 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f h", s / 3600);
  }
  return buf;
}

}  // namespace

CheckpointCost ComputeCheckpointCost(const DowntimeReport& r, std::int64_t saves, int incidents,
                                     const json& plan) {
  CheckpointCost c;
  c.saves = saves;
  const bool has_plan = plan.is_object();
  if (has_plan) {
    c.plan_interval_s = plan.value("memory_interval_s", 0.0);
    if (!(c.plan_interval_s > 0)) c.plan_interval_s = plan.value("storage_interval_s", 0.0);
  }
  if (!r.has_progress || !(r.wall_s > 0)) return c;
  c.save_share = r.checkpoint_s / r.wall_s;
  c.lost_share = r.lost_s / r.wall_s;
  if (saves > 0) {
    c.interval_s = (r.productive_s + r.checkpoint_s + r.lost_s) / static_cast<double>(saves);
    c.save_cost_s = r.checkpoint_s / static_cast<double>(saves);
  } else if (has_plan) {
    c.save_cost_s = plan.value("save_cost_s", 0.0);
  }
  if (incidents > 0) {
    c.mtbf_s = r.wall_s / incidents;
    c.mtbf_from = "incidents";
  } else if (has_plan && plan.value("job_mtbf_s", 0.0) > 0) {
    c.mtbf_s = plan.value("job_mtbf_s", 0.0);
    c.mtbf_from = "plan";
  }
  if (c.mtbf_s > 0 && c.save_cost_s > 0) {
    c.optimum_s = OptimalCheckpointInterval(c.save_cost_s, c.mtbf_s);
    c.optimum_share = CheckpointOverhead(c.optimum_s, c.save_cost_s, c.mtbf_s, 0);
  }
  return c;
}

json CheckpointCostJson(const CheckpointCost& c) {
  auto known = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  return {{"saves", c.saves},
          {"interval_s", known(c.interval_s)},
          {"save_share", c.save_share},
          {"lost_share", c.lost_share},
          {"save_cost_s", known(c.save_cost_s)},
          {"mtbf_s", known(c.mtbf_s)},
          {"mtbf_from", c.mtbf_from},
          {"optimum_interval_s", known(c.optimum_s)},
          {"optimum_share", c.optimum_s > 0 ? json(c.optimum_share) : json(nullptr)},
          {"plan_interval_s", known(c.plan_interval_s)},
          {"line", CheckpointCostLine(c)}};
}

std::string CheckpointCostLine(const CheckpointCost& c) {
  if (c.saves <= 0 || !(c.interval_s > 0)) return "";
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "checkpoints: %lld save(s), one every %s of training: they cost %.1f %% of this job "
                "(saves %.1f %%, work lost at failures %.1f %%)",
                static_cast<long long>(c.saves), Span(c.interval_s).c_str(),
                100 * (c.save_share + c.lost_share), 100 * c.save_share, 100 * c.lost_share);
  std::string line = buf;
  if (c.optimum_s > 0) {
    std::snprintf(buf, sizeof(buf), "; every %s would have cost about %.1f %% (Young/Daly for a save blocking "
                  "%.3f s and a failure every %s, %s)",
                  Span(c.optimum_s).c_str(), 100 * c.optimum_share, c.save_cost_s, Span(c.mtbf_s).c_str(),
                  c.mtbf_from == "incidents" ? "as this job saw them" : "as its checkpoint plan assumes");
    line += buf;
  }
  if (c.plan_interval_s > 0) line += "; its checkpoint plan says every " + Span(c.plan_interval_s);
  return line;
}

}  // namespace trainguard
