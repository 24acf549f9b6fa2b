// Downtime accounting for one incident: how long detection, shutdown and
// restart took and how much work was lost, as the `downtime` event states
// it (a line for people and JSON for tools). Pure: the controller records it.
#pragma once

#include <string>

#include "common/clock.h"
#include "controller/incident.h"

namespace trainguard {

struct DowntimeRecord {
  std::string line;  // "incident 2 (crash): detection 0.012 s, shutdown 1.204 s, restart ..."
  std::string json;  // detection_ms, shutdown_ms, restart_ms (-1 = unknown), lost_steps (null = unknown), ...
};

// How the restarted generation reached its first step, as the rank that
// made it first reported (RankStatus start-up marks, ms since its launch;
// -1 = not reported).
struct RestartPath {
  Nanos first_step_wall = 0;        // 0: it never made a step
  Nanos generation_start_wall = 0;  // when the controller ordered the start
  std::int64_t standby_wait_ms = -1;  // the start waited for the rank's standby's imports
  std::int64_t script_start_ms = -1;
  std::int64_t pg_init_begin_ms = -1;
  std::int64_t pg_init_end_ms = -1;
  std::int64_t restore_begin_ms = -1;
  std::int64_t restore_end_ms = -1;
  std::int64_t first_step_ms = -1;
  // The checkpoint the generation resumed from, as the rank reported it
  // (trainguard.Checkpointer, or torch.load of a file trainguard marked);
  // -1 = unknown: lost work counts from the newest committed checkpoint.
  std::int64_t resumed_step = -1;
  bool warm = false;
};

// Restart split into its terms (ms): rendezvous (all stopped -> start
// ordered), standby_wait (waiting for a warm standby's imports, within the
// process start), process_start (the rest, -> the script begins), imports (-> process-group
// init or checkpoint restore or first step begins), pg_init, restore,
// first_step (the rest: model set-up and the step). Terms the rank did not
// report are folded into the next one; they add up to the restart.
DowntimeRecord DescribeDowntime(const Incident& inc, const RestartPath& path);
// `first_step_wall`: when the restarted job made its first step, 0 if it never did.
DowntimeRecord DescribeDowntime(const Incident& inc, Nanos first_step_wall);

}  // namespace trainguard
