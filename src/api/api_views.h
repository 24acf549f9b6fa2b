// The JSON documents of the HTTP API (docs/api.md), built from a controller
// snapshot and what the store holds. Pure: the server does the reading.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "controller/job_snapshot.h"
#include "report/downtime_report.h"
#include "store/event_store.h"

namespace trainguard {

// What the live downtime report needs of the controller. A running job
// whose newest step came with the last heartbeats counts as stepping now.
LiveJob LiveJobOf(const JobSnapshot& job);

// GET /api/v1/job: the job's state and progress, with ETTR when known.
nlohmann::json JobJson(const JobSnapshot& job, const JobRecord* record, const DowntimeReport* report);
// GET /api/v1/nodes: the job's nodes with their health and newest diagnostics.
nlohmann::json NodesJson(const JobSnapshot& job, const std::vector<NodeHealth>& health,
                         const std::vector<DiagnosticsRecord>& diagnostics);
// GET /api/v1/ranks.
nlohmann::json RanksJson(const JobSnapshot& job);
// One event as the API and the live stream give it.
nlohmann::json EventJson(const Event& e);
// GET /api/v1/timings: step timing rows with their totals as objects (µs).
nlohmann::json TimingsJson(const std::vector<StepTimingRecord>& rows);
// GET /api/v1/stragglers: the nodes named now and the findings so far.
nlohmann::json StragglersJson(const JobSnapshot& job, const std::vector<Event>& events);

}  // namespace trainguard
