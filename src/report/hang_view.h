// `trainguard hang`: where a job's hang sat in its parallel layout, from the
// location the controller stored with the hang incident.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "store/event_store.h"
#include "trainguard/status.h"

namespace trainguard {

// The hang incident `incident` (0: the newest hang) of a job's events:
// {job_id, incident, description, detected_unix_ms, culprit_rank, culprit_node,
//  location: {...}} (location as HangLocation::ToJson, null if no rank kept a
// journal). NotFound if the job had no such hang.
StatusOr<nlohmann::json> FindHang(const std::string& job_id, const std::vector<Event>& events,
                                  int incident);

// The same for people: the explanation, a grid of ranks by their coordinates
// with each rank's state, and one line per rank that waits or is waited for.
std::string HangText(const nlohmann::json& hang);

}  // namespace trainguard
