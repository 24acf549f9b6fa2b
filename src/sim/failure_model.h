// FailureModel: what fails in a simulated fleet, how often, and how each
// failure looks to the controller's detectors. Loaded from a JSON file with
// its sources (sim/models/*.json; format: docs/simulator.md).
//
// A model is a list of categories. Each has a rate, given one of three ways
// (whichever its source published):
//   count            failures observed over the model's `basis` (GPUs, days)
//   per_1000_node_days
//   mtbf_node_hours  one node's mean time between failures of this category
// and a signal: what the failure does to the job, so that detection comes
// from the detectors and not from an assumed constant:
//   crash      a rank exits (exit code or signal) with the category's output
//              and kernel lines: the crash detector and the rules see them
//   hang       a rank stops inside its step; its peers wait in the next
//              collective (the journal says so): the hang detector and locator
//   node_down  the host dies: its heartbeats stop (the heartbeat detector);
//              the scheduler says the host is down
//   sdc        silent data corruption: nothing shows for `latency_hours`,
//              then the loss turns NaN (a crash); the work since the
//              corruption was wrong, whatever was checkpointed
//   planned    maintenance: the job checkpoints, then the host leaves
// A category may mix signals ("signals": {"crash": 0.8, "hang": 0.2}).
// `persistent` is the share of failures that stay with the node (it fails
// the same way at every start until it is evicted); evicted nodes are back
// after `repair_hours`. `bad_nodes` makes a share of the nodes fail
// `rate_multiplier` times as often (the bad-node subpopulation).
//
// `stragglers` (optional) are not failures: a node slows down (a throttled
// GPU, a busy CPU, a degraded link) and, training being synchronous, the
// whole job with it, for a while. They are drawn apart from the failures
// (their own random stream: a model without them fails the same way) and
// enter neither the MTBF nor the categories.
//
// Pure data: no clock, no I/O but Load's read.
#pragma once

#include <string>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

enum class FailureSignal { kCrash, kHang, kNodeDown, kSdc, kPlanned };
const char* FailureSignalName(FailureSignal s);

struct FailureCategory {
  std::string name;   // "faulty_gpu"
  std::string label;  // "Faulty GPU", as the source names it
  bool hardware = false;
  double per_node_day = 0;  // failures per node per day (all three forms end here)
  std::vector<std::pair<FailureSignal, double>> signals;  // weights sum to 1
  double persistent = 0;     // share that stays with the node
  double repair_hours = 24;  // an evicted node is back after this long
  double latency_hours = 0;  // sdc: corruption -> NaN
  // What a crash shows (crash, sdc).
  int exit_code = 1;
  int signal = 0;
  std::vector<std::string> log_tail;
  std::vector<std::string> kernel_lines;
};

// Fail-slow: a node's steps take `slowdown` times as long (log-uniform over
// [slowdown_min, slowdown_max]) for a time log-uniform over [minutes_min,
// minutes_max]. `on_node` is the share that shows in the node's own compute
// time, where the straggler detector compares it with its peers'; the rest
// (a degraded link, congestion) lengthens every node's collectives alike and
// names no node.
struct StragglerModel {
  double per_node_day = 0;
  double slowdown_min = 1.1, slowdown_max = 1.5;
  double minutes_min = 0.5, minutes_max = 600;
  double on_node = 0.5;
  std::string source;
  bool enabled() const { return per_node_day > 0; }
};

struct FailureModel {
  std::string name;
  std::string source;
  int gpus_per_node = 8;
  double bad_node_fraction = 0;
  double bad_node_multiplier = 1;
  std::vector<FailureCategory> categories;
  StragglerModel stragglers;

  double PerNodeDay() const;  // all categories together
  // Parses a model; errors name the file, the field and what is wrong.
  static StatusOr<FailureModel> Parse(const std::string& text, const std::string& origin);
  static StatusOr<FailureModel> Load(const std::string& path);
};

}  // namespace trainguard
