// The job's metrics for /metrics (docs/api.md lists them): built at scrape
// time from a controller snapshot, the live downtime report and the newest
// step timings. Pure: no I/O.
#pragma once

#include <string>
#include <vector>

#include "api/prometheus_text.h"
#include "controller/job_snapshot.h"
#include "report/downtime_report.h"
#include "store/event_store.h"

namespace trainguard {

// Seconds per step a node's ranks spent in one phase, averaged over steps.
struct NodePhaseTime {
  std::string node;
  std::string phase;   // "forward", "gpu:forward", "comm:all_reduce", ...
  double seconds = 0;
};

// From step timing rows (of any ranks and steps): per node and phase, the
// mean over the node's rank-steps (a phase absent in a rank-step counts 0).
std::vector<NodePhaseTime> MeanPhaseTimes(const std::vector<StepTimingRecord>& rows);

std::vector<MetricFamily> JobMetrics(const JobSnapshot& job, const DowntimeReport& report,
                                     const std::vector<NodePhaseTime>& phases);

}  // namespace trainguard
