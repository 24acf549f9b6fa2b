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

// `first_step_wall`: when the restarted job made its first step, 0 if it never did.
DowntimeRecord DescribeDowntime(const Incident& inc, Nanos first_step_wall);

}  // namespace trainguard
