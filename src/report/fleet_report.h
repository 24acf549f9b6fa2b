// The fleet's incidents: every job in the store at once (`trainguard report
// --fleet`). Counts per category, per node and per job, and the patterns
// that recur across jobs: the same rule on one node in several jobs (the
// node), the same program failing with the same rule at the same rank and
// step in several jobs on different nodes (the program). Pure: records in,
// report out.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/event_store.h"

namespace trainguard {

struct FleetCount {
  std::string key;  // the category, node or job
  int incidents = 0;
  std::set<std::string> jobs;
  std::set<std::string> nodes;
  std::map<std::string, int> categories;
};

struct FleetPattern {
  std::string points_to;  // "node" or "program"
  std::string rule;
  std::string category;
  std::string node;       // points_to == "node"
  std::string program;    // points_to == "program"
  int rank = -1;          // points_to == "program"
  std::int64_t step = -1; // points_to == "program"
  std::set<std::string> jobs;
  std::set<std::string> nodes;
};

struct FleetReport {
  int jobs = 0;
  int incidents = 0;
  std::vector<FleetCount> by_category;  // most incidents first
  std::vector<FleetCount> by_node;
  std::vector<FleetCount> by_job;
  std::vector<FleetPattern> recurring;  // in two or more jobs
};

FleetReport ComputeFleetReport(const std::vector<JobRecord>& jobs, const std::vector<IncidentRecord>& incidents);
std::string FleetReportText(const FleetReport& report);
nlohmann::json FleetReportJson(const FleetReport& report);

}  // namespace trainguard
