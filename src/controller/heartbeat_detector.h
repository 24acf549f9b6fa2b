// Lost-node detection: a node whose agent sent no heartbeat for
// missed_heartbeats x heartbeat_interval is lost.
#pragma once

#include <vector>

#include "controller/finding.h"
#include "controller/job_config.h"
#include "controller/job_view.h"

namespace trainguard {

// One finding (kind "node_lost") per silent node, in the view's order.
std::vector<Finding> DetectSilentNodes(const JobView& view, const JobConfig& config);

}  // namespace trainguard
