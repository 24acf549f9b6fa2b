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
struct Corroboration;

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
  // Suspects: culprit nodes of a hardware verdict that rests on log lines
  // alone, which nothing of their own corroborated: diagnosed before the
  // restart (a failing node is evicted then), never evicted blind.
  std::vector<std::string> diagnose_nodes;
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

// A node suspected on log lines alone (Verdict::diagnose_nodes): where and
// when, so that the same GPU failing again later evicts it.
struct Suspicion {
  std::string node;
  int gpu = -1;            // the culprit rank's GPU (its local rank), -1 if unknown
  std::string rule;
  std::int64_t step = -1;  // the step it failed at
  bool operator==(const Suspicion&) const = default;
};

struct PolicyMemory {
  std::vector<IncidentSignature> signatures;  // of each incident, in order
  std::vector<Suspicion> suspicions;          // the newest 64
  std::int64_t best_failure_step = -1;   // highest step any incident failed at
  std::int64_t best_checkpoint_step = -1;  // newest checkpoint any incident had
  int no_progress_incidents = 0;
  // {"signatures": [{"category": C, "rule": R, "rank": N, "step": N}, ...],
  //  "best_failure_step": N, "best_checkpoint_step": N, "no_progress_incidents": N,
  //  "suspicions": [{"node": N, "gpu": G, "rule": R, "step": S}, ...]}
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
  // `corroboration`: what the culprit nodes' own signals say of a verdict
  // read from log lines (corroboration.h); null: not looked at, the
  // verdict stands as it is.
  Verdict Decide(const Blame& blame, const Incident& inc, const FleetFinding& fleet,
                 const Corroboration* corroboration = nullptr, int culprit_gpu = -1);

  const PolicyMemory& memory() const { return memory_; }
  // A restarted controller's: the memory its predecessor recorded.
  void Restore(PolicyMemory memory) { memory_ = std::move(memory); }

 private:
  // A log-only hardware verdict that some culprit nodes' own signals do not
  // corroborate: who is evicted, who is diagnosed, remembered (Suspicion).
  void DecideOnSuspects(const Blame& b, const Corroboration& c, int culprit_gpu, Verdict* v);

  const int no_progress_restarts_;
  const double min_confidence_;
  PolicyMemory memory_;
};

}  // namespace trainguard
