// Finding: what a detector reports, typed, with its evidence. Detectors only
// find; the recovery policy decides what happens next, from the finding's
// kind and, where a detector judged structured data itself (step timings,
// link counters), from the verdict it carries. Attribution rules classify log
// text; they never re-decide a detector's verdict.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attribution/attribution.h"
#include "common/clock.h"

namespace trainguard {

// Every kind of failure a detector reports. The names are the `failure_kind`
// of the `failure` event (docs/events.md).
enum class FindingKind {
  kRankFailed,    // crash_detector: a rank exited non-zero or was killed
  kHang,          // hang_detector: ranks made no progress for the hang timeout
  kNodeLost,      // heartbeat_detector, a closed session, a stop that never came
  kFatalLine,     // log_alert_detector: a line a "fatal" scan rule matched
  kStraggler,     // straggler_detector, with --straggler-action evict
  kLinkFlapping,  // link_monitor: a node's link lost its carrier too often
  kReplicaDivergence,  // replica_check: a rank's parameters differ from its replicas' (docs/sdc.md)
  kNumericAnomaly,     // numeric_check: NaN/Inf in losses or gradient norms (docs/sdc.md)
};
const char* FindingKindName(FindingKind kind);

// A conclusion a detector drew from structured data, and the action it
// supports. The recovery policy takes it as it stands (its own guards — a
// restart storm, another job's history pointing at the program — still
// apply); no rule file can change it.
struct DetectorVerdict {
  std::string rule_id;      // stable name of the judgement, e.g. "straggler-compute"
  std::string category;     // one of AttributionCategories()
  bool hardware = true;
  std::string persistence = "persistent";
  std::string description;  // one line, for people
  std::vector<std::string> evict_nodes;  // the nodes the verdict supports evicting
  std::string action;  // "": from evict_nodes; "stop": restart once, stop if the same happens again
};

struct Finding {
  FindingKind kind = FindingKind::kRankFailed;
  std::string description;  // one line, for people
  std::string node;         // where it was seen first ("" if unknown)
  int rank = -1;            // the rank it was seen on first (-1: none)
  std::int64_t rank_step = -1;  // that rank's step
  Nanos fault_wall = 0;     // when the fault happened, as well as known
  std::vector<int> capture_stacks_of;  // ranks whose stacks the agents dump before stopping
  std::vector<int> hung_ranks;         // hang: every rank without progress
  std::vector<int> roots;              // hang: the ranks the others wait for (journals)
  // Hang: what sets `rank` apart from the other stuck ranks (stopped, outside
  // any collective while they wait in one, the journals' wait-for root); ""
  // when nothing does and `rank` is only the one noticed first.
  std::string culprit_evidence;
  std::vector<LogLine> lines;          // evidence for the attribution
  std::string detail_json = "{}";      // the event's detail
  int exit_code = 0;                   // rank_failed: the rank's exit code (0 if killed)
  int signal = 0;                      // rank_failed: the signal that killed it, 0 if none
  std::optional<DetectorVerdict> verdict;  // straggler, link_flapping: the detector's own judgement
};

}  // namespace trainguard
