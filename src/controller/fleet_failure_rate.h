// The failure rate the fleet's history shows (docs/checkpoint_policy.md):
// the incidents of the jobs in the shared store that ended, per GPU-hour
// they held. A new job's checkpoint plan starts from it instead of a
// published rate when the history holds enough failures to say something.
// Pure: the controller reads the store and passes what it read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/event_store.h"

namespace trainguard {

struct FleetFailureRate {
  double gpu_hours = 0;       // held by the jobs that ended
  std::int64_t failures = 0;  // their incidents
  int jobs = 0;
  double PerGpuHour() const { return gpu_hours > 0 ? static_cast<double>(failures) / gpu_hours : 0; }
  // "12 failure(s) in 3400 GPU-hours of 5 job(s) in this store"
  std::string Describe() const;
};

// Over the jobs that ended (SUCCEEDED or FAILED, with an end after their
// start; GPUs from their config: nnodes x nproc_per_node), except `except_job`.
FleetFailureRate ReadFleetFailureRate(const std::vector<JobRecord>& jobs, const std::vector<IncidentRecord>& incidents,
                                      const std::string& except_job);

}  // namespace trainguard
