// Blame and recovery policy: who caused an incident, and whether the job
// restarts, evicts nodes and restarts, or stops. Pure logic: the controller
// gathers the facts (the Incident, the nodes' history) and records the result.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "attribution/attribution.h"
#include "controller/incident.h"
#include "trainguard/status.h"

namespace trainguard {

struct FleetFinding;

// Categories that point at the machine rather than the software.
bool IsHardwareCategory(const std::string& category);

struct Blame {
  Attribution attribution;
  std::vector<int> culprit_ranks;
  std::set<std::string> culprit_nodes;
  int culprit_rank = -1;          // the first culprit rank, -1 if none
  std::string culprit_node;       // the culprit rank's own node, else the first culprit node
  std::int64_t step = -1;         // the step the culprit failed at
  std::string first_in_time;      // why the first failure in time overrode the loudest symptom
  std::string culprit_evidence;   // hang: why these ranks, or why no rank is named
  // "rank 3 on node1" / "node node1" / "unknown"
  std::string CulpritText() const;
};

// Attributes `inc` with `rules` (may be null: nothing is attributed) and names
// its culprits. `node_of_rank` says which node ran a rank ("" if unknown).
Blame AssignBlame(const RuleSet* rules, const Incident& inc,
                  const std::function<std::string(int)>& node_of_rank);

enum class Decision { kRestart, kEvict, kStop };
const char* DecisionName(Decision d);

struct Verdict {
  Decision decision = Decision::kRestart;
  std::string why;                       // one line
  std::vector<std::string> evict_nodes;  // kEvict only
  std::string history;                   // what other jobs said of this failure (FleetFinding::Summary)
  std::string evidence_json = "{}";      // kEvict: what the eviction rests on, kept with the node
};

// What the policy remembers of a job's incidents. It is part of the job's
// persisted status: recorded with every decision (the `decision` event's
// detail.policy) and loaded back by a restarted controller, so that a
// deterministic failure is stopped at its first repeat across a controller
// restart too.
// What identifies an incident for the policy: its cause and where it struck.
struct IncidentSignature {
  std::string category;
  std::string rule;
  int rank = -1;           // the culprit rank, -1 if none
  std::int64_t step = -1;  // the step it failed at
  bool operator==(const IncidentSignature&) const = default;
};

struct PolicyMemory {
  std::vector<IncidentSignature> signatures;  // of each incident, in order
  std::int64_t best_failure_step = -1;   // highest step any incident failed at
  std::int64_t best_checkpoint_step = -1;  // newest checkpoint any incident had
  int no_progress_incidents = 0;
  // {"signatures": [{"category": C, "rule": R, "rank": N, "step": N}, ...],
  //  "best_failure_step": N, "best_checkpoint_step": N, "no_progress_incidents": N}
  std::string ToJson() const;
  // The inverse of ToJson; InvalidArgument naming the field on a bad record.
  // Signatures recorded before they were objects ("category|rule|rank|step")
  // are read too: a job recorded by an older controller resumes.
  static StatusOr<PolicyMemory> FromJson(const std::string& json_text);
};

// Remembers the incidents of one job: a deterministic failure seen twice, or
// a run of related incidents (same cause or culprit rank) that never got
// further, stops the restart loop.
class RecoveryPolicy {
 public:
  // `min_confidence`: JobConfig::min_confidence.
  explicit RecoveryPolicy(int no_progress_restarts, double min_confidence = 0.5)
      : no_progress_restarts_(no_progress_restarts), min_confidence_(min_confidence) {}

  // `fleet`: what other jobs' incidents say of this one (fleet_history.h).
  Verdict Decide(const Blame& blame, const Incident& inc, const FleetFinding& fleet);

  const PolicyMemory& memory() const { return memory_; }
  // A restarted controller's: the memory its predecessor recorded.
  void Restore(PolicyMemory memory) { memory_ = std::move(memory); }

 private:
  const int no_progress_restarts_;
  const double min_confidence_;
  PolicyMemory memory_;
};

}  // namespace trainguard
