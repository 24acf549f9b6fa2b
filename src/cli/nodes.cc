// `trainguard nodes` and `trainguard uncordon`: what the store knows of each
// node across jobs, and clearing an operator's suspicion.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/json_text.h"
#include "common/clock.h"
#include "controller/job_config.h"
#include "controller/recovery_policy.h"
#include "store/event_store.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::unique_ptr<EventStore> OpenExisting(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "trainguard: error: no store at %s (use --store PATH)\n", path.c_str());
    return nullptr;
  }
  auto store = OpenSqliteEventStore(path);
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
  struct Row {
    NodeHealth health;
    int hardware = 0;       // hardware incidents that still count (window, not cleared)
    int incidents = 0;
    IncidentRecord last;
  };
  std::map<std::string, Row> rows;
  for (const auto& h : *health) rows[h.node].health = h;
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
      out.push_back({{"node", node},
                     {"status", r.health.status.empty() ? "ok" : r.health.status},
                     {"reason", r.health.reason},
                     {"marked_by_job", r.health.job_id},
                     {"since_unix_ms", r.health.wall_ns / kMillisecond},
                     {"incidents", r.incidents},
                     {"hardware_incidents_counting", r.hardware},
                     {"last_incident", r.incidents == 0 ? json(nullptr)
                                                        : json{{"job_id", r.last.job_id},
                                                               {"category", r.last.category},
                                                               {"rule", r.last.rule},
                                                               {"action", r.last.action}}}});
    }
    std::cout << out.dump(2, ' ', false, kReplaceBadUtf8) << "\n";
    return 0;
  }
  if (rows.empty()) {
    std::printf("no node has a record in %s\n", o.store.c_str());
    return 0;
  }
  std::printf("%-20s %-8s %-17s %9s %9s  %s\n", "NODE", "STATUS", "SINCE", "INCIDENTS",
              "HARDWARE", "REASON / LAST INCIDENT");
  for (const auto& [node, r] : rows) {
    std::string status = r.health.status.empty() ? "ok" : r.health.status;
    std::string why = r.health.reason;
    if (why.empty() && r.incidents > 0) why = r.last.category + " (" + r.last.rule + ") in job " + r.last.job_id;
    std::printf("%-20s %-8s %-17s %9d %9d  %s\n", node.c_str(), status.c_str(),
                When(r.health.wall_ns).c_str(), r.incidents, r.hardware, why.c_str());
  }
  std::printf("HARDWARE: hardware incidents of the last 7 days since the node was last cleared; "
              "a node with any is evicted on unexplained failures.\n");
  return 0;
}

int UncordonNode(const std::string& store_path, const std::string& node) {
  auto store = OpenExisting(store_path);
  if (!store) return 2;
  auto health = store->GetNodeHealth(node);
  auto incidents = store->IncidentsOnNode(node);
  if (!health.ok() || !incidents.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n",
                 (!health.ok() ? health.status() : incidents.status()).message().c_str());
    return 2;
  }
  if (health->status.empty() && incidents->empty()) {
    std::fprintf(stderr, "trainguard: error: node %s has no record in %s (see trainguard nodes)\n",
                 node.c_str(), store_path.c_str());
    return 1;
  }
  std::string was = health->status.empty() ? "ok" : health->status;
  Status s = store->SetNodeHealth({node, "ok", "cleared by an operator (was " + was +
                                       (health->reason.empty() ? "" : ": " + health->reason) + ")",
                                   "", WallNowNanos()});
  if (!s.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", s.message().c_str());
    return 2;
  }
  std::printf("node %s cleared (was %s); its earlier incidents no longer count against it\n",
              node.c_str(), was.c_str());
  return 0;
}

}  // namespace trainguard
