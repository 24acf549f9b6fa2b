// What other jobs' incidents say about this one (the store is shared by the
// fleet: docs/store.md). Two patterns decide:
//   - the same error on the same node in other jobs points to the node:
//     it is evicted, whatever this job's own rule would have done;
//   - the same error of the same program at the same rank and step, on other
//     nodes, points to the application: it follows the program, not the
//     machine, and the job stops with the other jobs named.
// Pure: the controller reads the store and hands the records in.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/recovery_policy.h"
#include "store/event_store.h"

namespace trainguard {

struct PastIncident {
  std::string job_id;
  int incident = 0;
  std::string node;
  int rank = -1;
  std::string category;
  std::string rule;
  std::int64_t step = -1;
};

struct FleetFinding {
  // Culprit node -> hardware incidents it had in other jobs.
  std::map<std::string, int> hardware_on_node;
  // The same rule on a culprit node in other jobs (not the application's pattern).
  std::vector<PastIncident> same_error_on_node;
  // The same program failing with the same rule at the same rank and step in
  // other jobs, on other nodes.
  std::vector<PastIncident> same_error_elsewhere;
  // Culprit node -> why it is watched: a new GPU error (ECC, row remap) in
  // a heartbeat, or a hardware warning line, within the suspicion window.
  std::map<std::string, std::string> watched_nodes;

  bool PointsAtNode() const { return !same_error_on_node.empty(); }
  bool PointsAtApplication() const { return !same_error_elsewhere.empty(); }
  // One line naming the other jobs, "" when nothing was found.
  std::string Summary() const;
  // {"same_error_on_node": [...], "same_error_elsewhere": [...], "hardware_on_node": {...}}
  std::string EvidenceJson() const;
};

struct FleetQuery {
  std::string job_id;              // this job: its own incidents do not count
  std::string program;             // ProgramOf this job's argv
  std::map<std::string, std::string> program_of_job;  // other jobs' programs
  // Per culprit node, the oldest time that counts (the suspicion window, or
  // when an operator last cleared the node); nodes not listed: `since`.
  std::map<std::string, Nanos> node_since;
  Nanos since = 0;
};

// What identifies "the same program" across jobs: the script a Python
// interpreter runs (or the module after -m), else the executable. Paths of
// outputs and flags may differ between submissions.
std::string ProgramOf(const std::vector<std::string>& argv);

FleetFinding ReadFleetHistory(const Blame& blame, const std::vector<IncidentRecord>& incidents,
                              const FleetQuery& query);

}  // namespace trainguard
