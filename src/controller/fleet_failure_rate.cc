#include "controller/fleet_failure_rate.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace trainguard {

std::string FleetFailureRate::Describe() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%lld failure(s) in %.0f GPU-hours of %d job(s) in this store",
                static_cast<long long>(failures), gpu_hours, jobs);
  return buf;
}

FleetFailureRate ReadFleetFailureRate(const std::vector<JobRecord>& jobs, const std::vector<IncidentRecord>& incidents,
                                      const std::string& except_job) {
  FleetFailureRate fleet;
  std::unordered_map<std::string, bool> ended;
  for (const auto& j : jobs) {
    if (j.job_id == except_job || (j.state != "SUCCEEDED" && j.state != "FAILED")) continue;
    if (j.ended_wall_ns <= j.created_wall_ns) continue;  // ended before this trainguard kept end times
    nlohmann::json config = nlohmann::json::parse(j.config_json, nullptr, false);
    if (!config.is_object()) continue;
    const std::int64_t gpus = config.value("nnodes", 0LL) * config.value("nproc_per_node", 0LL);
    if (gpus <= 0) continue;
    fleet.gpu_hours += static_cast<double>(gpus) * static_cast<double>(j.ended_wall_ns - j.created_wall_ns) /
                       (3600.0 * kSecond);
    ++fleet.jobs;
    ended[j.job_id] = true;
  }
  for (const auto& i : incidents) {
    if (ended.count(i.job_id)) ++fleet.failures;
  }
  return fleet;
}

}  // namespace trainguard
