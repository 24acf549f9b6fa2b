// The downtime accounting of one job, computed from its event log
// (docs/events.md), and its incidents with their attribution.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/checkpoint_cost.h"
#include "store/event_store.h"

namespace trainguard {

// Seconds of the job's wall time, split so that the terms add up:
//   wall = productive + checkpoint + startup + Σ(lost + detection + shutdown + restart) + tail
struct DowntimeReport {
  std::string job_id;
  std::string state;
  int restarts = 0;
  double wall_s = 0;          // job created -> job ended
  double productive_s = 0;    // step time whose work was kept
  double startup_s = 0;       // job created -> first step
  double lost_s = 0;          // step time thrown away (since the last checkpoint)
  std::int64_t lost_steps = 0;
  double detection_s = 0;
  double shutdown_s = 0;
  double restart_s = 0;
  double tail_s = 0;          // last step -> job ended
  double checkpoint_s = 0;    // blocked in checkpoint saves, of the kept step time
  // Storage's share, inside the terms above (not added to them):
  double checkpoint_wait_s = 0;  // of checkpoint_s: saves waiting for the previous save's write (phase 2)
  double data_wait_s = 0;        // of productive_s: the job waiting for a rank's data (per step, the longest)
  double ettr = 0;            // productive / wall
  bool has_progress = false;  // some generation reported a step; if not, the
                              // step-based figures (productive, lost, ETTR) are unknown
  nlohmann::json incidents = nlohmann::json::array();
  CheckpointCost checkpoints;  // what the interval cost, against the optimum (checkpoint_cost.h)
};

// What the controller knows of a job that has not ended, for a report up to
// now: the running generation's newest step and checkpoint time.
struct LiveJob {
  Nanos now_wall = 0;
  std::string state;               // RUNNING, STOPPING, ...
  int restarts = 0;
  Nanos last_step_wall = 0;        // newest step of the running generation, 0 if none
  double checkpoint_overhead_ms = 0;  // of the running generation
  double checkpoint_wait_ms = 0;
  double data_wait_ms = 0;
  std::int64_t checkpoint_saves = 0;  // rank 0's saves so far (trainguard.Checkpointer), all generations
  // The running generation and its first step (0: none yet), as the
  // controller knows them: its first_step event may not be stored yet.
  std::int64_t generation = -1;
  Nanos first_step_wall = 0;
  std::int64_t first_step_no = -1;
};

// One line naming storage when it held the job up noticeably: the data
// loader's waits 20 % of the kept step time or more (a DataLoader's own
// hand-over costs a few per cent), or saves waiting for the previous save's
// write 10 % of the checkpoint overhead or more; "" if not.
std::string StorageLine(const DowntimeReport& r);

// The report of an ended job; with `live`, of a job that has not ended yet,
// as if it ended now (its tail is the time since the newest step). Without
// `live`, a job with no end is FailedPrecondition.
StatusOr<DowntimeReport> ComputeReport(const std::string& job_id, const std::vector<Event>& events,
                                       const LiveJob* live = nullptr);
nlohmann::json ReportJson(const DowntimeReport& r);
std::string ReportText(const DowntimeReport& r);

}  // namespace trainguard
