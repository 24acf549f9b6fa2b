// `trainguard nodes`, `cordon` and `uncordon`: what the store knows of each
// node across jobs (state, incidents, newest diagnostics, the actions taken on
// it and by whom), and an operator taking a node out of every job or
// returning it.
#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <array>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "cli/commands.h"
#include "common/json_text.h"
#include "common/clock.h"
#include "controller/job_config.h"
#include "controller/recovery_policy.h"
#include "store/event_store.h"
#include "store/node_cordon.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::unique_ptr<EventStore> OpenExisting(const std::string& path) {
  if (!IsPostgresUrl(path) && !std::filesystem::exists(path)) {
    std::fprintf(stderr, "trainguard: error: no store at %s (use --store PATH)\n", StoreDisplayName(path).c_str());
    return nullptr;
  }
  auto store = OpenEventStore(path);
  if (!store.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", store.status().message().c_str());
    return nullptr;
  }
  return std::move(store.value());
}

std::string When(Nanos wall) {
  if (wall <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(wall / kSecond);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M", std::localtime(&t));
  return buf;
}

// Who an operator command acts as: the user behind sudo if any, at this host.
std::string OperatorName() {
  std::string user;
  if (const char* s = std::getenv("SUDO_USER"); s != nullptr && *s != '\0') user = s;
  if (user.empty()) {
    if (const struct passwd* pw = getpwuid(getuid()); pw != nullptr) user = pw->pw_name;
  }
  if (user.empty()) user = "uid " + std::to_string(getuid());
  return "operator " + user + "@" + Hostname();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "trainguard: error: %s\n", s.message().c_str());
  return 2;
}

// Per device ("node:gpu"): silent data corruption confirmed and suspected, lifetime.
json SdcDevicesJson(const std::map<std::string, std::array<int, 2>>& devices) {
  json out = json::object();
  for (const auto& [device, counts] : devices) out[device] = {{"confirmed", counts[0]}, {"suspected", counts[1]}};
  return out;
}

}  // namespace

int ShowNodes(const EventsOptions& o) {
  auto store = OpenExisting(o.store);
  if (!store) return 2;
  auto health = store->ListNodeHealth();
  auto incidents = store->IncidentsOnNode("");
  if (!health.ok() || !incidents.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n",
                 (!health.ok() ? health.status() : incidents.status()).message().c_str());
    return 2;
  }
  auto diagnostics = store->LatestDiagnostics();
  auto actions = store->NodeActions("");
  if (!diagnostics.ok()) return Fail(diagnostics.status());
  if (!actions.ok()) return Fail(actions.status());
  struct Row {
    NodeHealth health;
    int hardware = 0;       // hardware incidents that still count (window, not cleared)
    int incidents = 0;
    IncidentRecord last;
    std::optional<DiagnosticsRecord> diagnostics;
    std::vector<NodeAction> actions;
    int sdc_confirmed = 0, sdc_suspected = 0;
    std::map<std::string, std::array<int, 2>> sdc_devices;  // "node:gpu" -> {confirmed, suspected}
  };
  std::map<std::string, Row> rows;
  for (const auto& h : *health) rows[h.node].health = h;
  for (const auto& d : *diagnostics) rows[d.node].diagnostics = d;
  for (const auto& a : *actions) {
    Row& r = rows[a.node];
    r.actions.push_back(a);
    r.sdc_confirmed += a.action == "sdc-confirmed";  // lifetime: silent data corruption is kept, never cleared
    r.sdc_suspected += a.action == "sdc-suspect";
    if (a.action == "sdc-confirmed" || a.action == "sdc-suspect") {
      json evidence = json::parse(a.evidence_json, nullptr, false);
      if (evidence.is_object() && evidence.contains("devices") && evidence["devices"].is_array()) {
        for (const auto& d : evidence["devices"]) {
          if (d.is_string()) ++r.sdc_devices[d.get<std::string>()][a.action == "sdc-confirmed" ? 0 : 1];
        }
      }
    }
  }
  Nanos window_start = WallNowNanos() - JobConfig{}.suspicion_window;
  for (const auto& i : *incidents) {
    if (i.node.empty()) continue;
    Row& r = rows[i.node];
    ++r.incidents;
    r.last = i;
    Nanos since = window_start;
    if (r.health.status == "ok") since = std::max(since, r.health.wall_ns);
    r.hardware += IsHardwareCategory(i.category) && i.wall_ns > since;
  }
  if (o.json) {
    json out = json::array();
    for (const auto& [node, r] : rows) {
      json history = json::array();
      for (const auto& a : r.actions) {
        json evidence = json::parse(a.evidence_json, nullptr, false);
        history.push_back({{"action", a.action}, {"by", a.by}, {"reason", a.reason}, {"job_id", a.job_id},
                           {"unix_ms", a.wall_ns / kMillisecond},
                           {"evidence", evidence.is_discarded() ? json(a.evidence_json) : evidence}});
      }
      json diag = nullptr;
      if (r.diagnostics) {
        json figures = json::parse(r.diagnostics->figures_json, nullptr, false);
        diag = {{"mode", r.diagnostics->mode}, {"job_id", r.diagnostics->job_id},
                {"unix_ms", r.diagnostics->wall_ns / kMillisecond},
                {"figures", figures.is_discarded() ? json(r.diagnostics->figures_json) : figures}};
      }
      out.push_back({{"node", node},
                     {"status", r.health.status.empty() ? "ok" : r.health.status},
                     {"reason", r.health.reason},
                     {"marked_by_job", r.health.job_id},
                     {"since_unix_ms", r.health.wall_ns / kMillisecond},
                     {"incidents", r.incidents},
                     {"hardware_incidents_counting", r.hardware},
                     {"sdc_confirmed", r.sdc_confirmed},
                     {"sdc_suspected", r.sdc_suspected},
                     {"sdc_devices", SdcDevicesJson(r.sdc_devices)},
                     {"last_incident", r.incidents == 0 ? json(nullptr)
                                                        : json{{"job_id", r.last.job_id},
                                                               {"category", r.last.category},
                                                               {"rule", r.last.rule},
                                                               {"action", r.last.action}}},
                     {"last_diagnostics", diag},
                     {"history", history}});
    }
    std::cout << out.dump(2, ' ', false, kReplaceBadUtf8) << "\n";
    return 0;
  }
  if (rows.empty()) {
    std::printf("no node has a record in %s\n", StoreDisplayName(o.store).c_str());
    return 0;
  }
  std::printf("%-20s %-8s %-17s %9s %9s %7s  %s\n", "NODE", "STATUS", "SINCE", "INCIDENTS",
              "HARDWARE", "SDC", "REASON / LAST INCIDENT");
  for (const auto& [node, r] : rows) {
    std::string status = r.health.status.empty() ? "ok" : r.health.status;
    std::string why = r.health.reason;
    if (!r.actions.empty() && r.actions.back().action != "uncordon" && status == "cordoned") {
      why = r.actions.back().action + " by " + r.actions.back().by + ": " + r.actions.back().reason;
    }
    if (why.empty() && r.incidents > 0) why = r.last.category + " (" + r.last.rule + ") in job " + r.last.job_id;
    if (r.diagnostics) why += (why.empty() ? "" : "; ") + std::string("diagnostics ") + When(r.diagnostics->wall_ns);
    const std::string sdc = std::to_string(r.sdc_confirmed) + "/" + std::to_string(r.sdc_suspected);
    std::printf("%-20s %-8s %-17s %9d %9d %7s  %s\n", node.c_str(), status.c_str(),
                When(r.health.wall_ns).c_str(), r.incidents, r.hardware, sdc.c_str(), why.c_str());
  }
  std::printf("HARDWARE: hardware incidents of the last 7 days since the node was last cleared; "
              "a node with any is evicted on unexplained failures. SDC: silent data corruption confirmed by replay / "
              "suspected (not reproduced), lifetime. A cordoned node gets no ranks until "
              "`trainguard uncordon`; `--json` has each node's history and newest diagnostics.\n");
  return 0;
}

int CordonNode(const std::string& store_path, const std::string& node, const std::string& reason) {
  if (node.empty()) return Fail(InvalidArgument("cordon: the node id is empty"));
  if (reason.find_first_not_of(" \t") == std::string::npos) {
    return Fail(InvalidArgument("cordon: say why with --reason (it is kept with the node)"));
  }
  auto opened = OpenEventStore(store_path);
  if (!opened.ok()) return Fail(opened.status());
  const std::string by = OperatorName();
  auto was = CordonNodeInStore(opened->get(), node, by, reason, WallNowNanos());
  if (!was.ok()) return Fail(was.status());
  std::printf("node %s cordoned by %s: %s; it gets no ranks in new jobs and restarts until `trainguard uncordon %s`%s\n",
              node.c_str(), by.c_str(), reason.c_str(), node.c_str(),
              was->status == "cordoned" ? (" (it was cordoned already: " + was->reason + ")").c_str() : "");
  return 0;
}

int UncordonNode(const std::string& store_path, const std::string& node, const std::string& reason) {
  auto store = OpenExisting(store_path);
  if (!store) return 2;
  const std::string by = OperatorName();
  auto was = UncordonNodeInStore(store.get(), node, by, reason, WallNowNanos());
  if (was.status().code() == StatusCode::kNotFound) {
    std::fprintf(stderr, "trainguard: error: node %s has no record in %s (see trainguard nodes)\n",
                 node.c_str(), StoreDisplayName(store_path).c_str());
    return 1;
  }
  if (!was.ok()) return Fail(was.status());
  std::printf("node %s cleared by %s (was %s); it may get ranks again and its earlier incidents no longer "
              "count against it\n",
              node.c_str(), by.c_str(), was->status.empty() ? "ok" : was->status.c_str());
  return 0;
}

}  // namespace trainguard
