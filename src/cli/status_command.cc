// `trainguard status [JOB]`: a terse view of a job, live from its
// controller's HTTP API while it runs, from the store once it ended (or when
// the controller cannot be reached).
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli_support.h"
#include "cli/commands.h"
#include "report/downtime_report.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string EttrText(const json& ettr) {
  return ettr.is_number() ? Fixed(100 * ettr.get<double>(), 1) + "%" : "unknown (no steps reported)";
}

// "#2 rank_crash: hardware, rank 3 on node1 -> restart (reason)"
std::string IncidentLine(const json& inc) {
  std::string culprit;
  for (const auto& r : inc.value("culprit_ranks", json::array())) {
    culprit += (culprit.empty() ? "rank " : ", ") + std::to_string(r.get<int>());
  }
  std::string nodes;
  for (const auto& n : inc.value("culprit_nodes", json::array())) nodes += (nodes.empty() ? "" : ", ") + n.get<std::string>();
  if (!nodes.empty()) culprit += (culprit.empty() ? "" : " on ") + nodes;
  std::string line = "#" + std::to_string(inc.value("incident", 0)) + " " + inc.value("failure_kind", "") + ": " +
                     inc.value("category", "not attributed yet");
  if (!culprit.empty()) line += ", " + culprit;
  if (inc.contains("decision")) {
    line += " -> " + inc.value("decision", "") + (inc.value("reason", "").empty() ? "" : " (" + inc.value("reason", "") + ")");
  }
  return line;
}

std::optional<json> GetJson(httplib::Client& client, const char* path) {
  auto res = client.Get(path);
  if (!res || res->status != 200) return std::nullopt;
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// The view from the controller; nullopt if it cannot be reached.
std::optional<std::string> LiveView(const std::string& url) {
  httplib::Client client(url);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  auto job = GetJson(client, "/api/v1/job");
  if (!job) return std::nullopt;
  auto nodes = GetJson(client, "/api/v1/nodes");
  auto incidents = GetJson(client, "/api/v1/incidents");
  const json& j = *job;
  std::string out = "job " + j.value("job_id", "") + ": " + j.value("state", "");
  const std::int64_t step = j.value("step", -1LL);
  out += step >= 0 ? "  step " + std::to_string(step) : "  no step yet";
  if (j.value("checkpoint_step", -1LL) >= 0) out += " (checkpoint " + std::to_string(j.value("checkpoint_step", -1LL)) + ")";
  if (j.value("steps_per_second", 0.0) > 0) out += "  " + Fixed(j.value("steps_per_second", 0.0), 2) + " steps/s";
  out += "  ETTR " + EttrText(j.value("ettr", json()));
  out += "  restarts " + std::to_string(j.value("restart_count", 0)) + "/" + std::to_string(j.value("max_restarts", 0));
  if (nodes) {
    int members = 0, up = 0, spares = 0;
    double oldest = 0;
    std::string stragglers;
    for (const auto& n : (*nodes)["nodes"]) {
      const std::string role = n.value("role", "");
      if (role == "spare") ++spares;
      if (role != "member" && role != "away") continue;
      ++members;
      if (n.value("connected", false)) ++up;
      if (n["heartbeat_age_s"].is_number()) oldest = std::max(oldest, n["heartbeat_age_s"].get<double>());
      if (n.value("straggler", false)) stragglers += (stragglers.empty() ? "" : ", ") + n.value("node_id", "");
    }
    out += "  nodes " + std::to_string(up) + "/" + std::to_string(members) + " up";
    if (spares > 0) out += " + " + std::to_string(spares) + " spare(s)";
    out += ", oldest heartbeat " + Fixed(oldest, 1) + " s";
    if (!stragglers.empty()) out += "\n  stragglers: " + stragglers;
  }
  if (incidents && !(*incidents)["incidents"].empty()) {
    out += "\n  last incident " + IncidentLine((*incidents)["incidents"].back());
    if ((*incidents).value("incident_open", false)) out += " (being handled)";
  } else if (j.value("incident_open", false)) {
    out += "\n  an incident is being handled: " + j.value("last_failure", "");
  }
  out += "\n  (live from " + url + ")";
  return out;
}

// The view from the store (an ended job, or a controller out of reach).
std::string StoredView(EventStore* store, const JobRecord& record, const std::string& why) {
  auto events = store->Events(record.job_id);
  if (!events.ok()) return "job " + record.job_id + ": " + record.state + " (" + events.status().message() + ")";
  LiveJob now{std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count(),
              record.state, 0, 0, 0};
  auto report = ComputeReport(record.job_id, *events, &now);
  if (!report.ok()) return "job " + record.job_id + ": " + record.state + " (" + report.status().message() + ")";
  json r = ReportJson(*report);
  std::string out = "job " + record.job_id + ": " + report->state + "  wall " + Fixed(report->wall_s, 1) + " s  ETTR " +
                    EttrText(r["ettr"]) + "  restarts " + std::to_string(report->restarts);
  if (!report->incidents.empty()) out += "\n  last incident " + IncidentLine(report->incidents.back());
  return out + "\n  (" + why + ")";
}

}  // namespace

int ShowStatus(const StatusCommandOptions& o) {
  std::unique_ptr<EventStore> store;
  std::string job_id;
  if (!OpenJob(o.stored, &store, &job_id)) return 2;
  const bool tty = isatty(STDOUT_FILENO);
  for (;;) {
    auto jobs = store->Jobs();
    if (!jobs.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", jobs.status().message().c_str());
      return 1;
    }
    JobRecord record;
    for (const auto& j : *jobs) {
      if (j.job_id == job_id) record = j;
    }
    const bool ended = record.state == "SUCCEEDED" || record.state == "FAILED";
    std::string url = o.url;
    if (url.empty()) {
      json config = json::parse(record.config_json, nullptr, false);
      if (config.is_object()) url = config.value("api_url", "");
    }
    std::optional<std::string> view;
    std::string why;
    if (ended) {
      why = "from the store: the job has ended";
    } else if (url.empty()) {
      why = "from the store: its controller serves no API (--http off)";
    } else {
      view = LiveView(url);
      why = "from the store: the controller at " + url + " does not answer";
    }
    std::string text = view ? *view : StoredView(store.get(), record, why);
    if (o.watch && tty) std::printf("\033[H\033[J");
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
    if (!o.watch || ended) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(o.interval_s * 1000)));
  }
}

}  // namespace trainguard
