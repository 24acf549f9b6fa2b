#include "controller/downtime.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"

namespace trainguard {

using nlohmann::json;

DowntimeRecord DescribeDowntime(const Incident& inc, Nanos first_step_wall) {
  RestartPath path;
  path.first_step_wall = first_step_wall;
  return DescribeDowntime(inc, path);
}

namespace {

// The restart's terms, or an empty object when the rank's marks are missing.
json RestartTerms(const Incident& inc, const RestartPath& p) {
  json t = json::object();
  if (p.first_step_wall <= 0 || inc.stopped_wall <= 0 || p.generation_start_wall <= 0 || p.first_step_ms < 0) {
    return t;
  }
  const std::int64_t restart = (p.first_step_wall - inc.stopped_wall) / kMillisecond;
  const std::int64_t rendezvous = std::clamp<std::int64_t>(
      (p.generation_start_wall - inc.stopped_wall) / kMillisecond, 0, restart);
  // The rank's own clock from its launch; its launch from the start order.
  const std::int64_t f = p.first_step_ms;
  const std::int64_t launch = std::max<std::int64_t>(0, restart - rendezvous - f);
  auto at = [&](std::int64_t mark, std::int64_t otherwise) { return mark >= 0 ? std::min(mark, f) : otherwise; };
  const std::int64_t script = at(p.script_start_ms, 0);
  std::int64_t next = f;
  if (p.pg_init_begin_ms >= 0) next = std::min(next, p.pg_init_begin_ms);
  if (p.restore_begin_ms >= 0) next = std::min(next, p.restore_begin_ms);
  const std::int64_t imports = std::max<std::int64_t>(0, next - script);
  const std::int64_t pg = p.pg_init_begin_ms >= 0 && p.pg_init_end_ms >= p.pg_init_begin_ms
                              ? at(p.pg_init_end_ms, f) - p.pg_init_begin_ms
                              : 0;
  const std::int64_t restore = p.restore_begin_ms >= 0 && p.restore_end_ms >= p.restore_begin_ms
                                   ? at(p.restore_end_ms, f) - p.restore_begin_ms
                                   : 0;
  const std::int64_t wait = std::clamp<std::int64_t>(p.standby_wait_ms, 0, script);
  const std::int64_t process_start = launch + script - wait;
  t = {{"rendezvous_ms", rendezvous},
       {"standby_wait_ms", wait},
       {"process_start_ms", process_start},
       {"imports_ms", imports},
       {"pg_init_ms", pg},
       {"restore_ms", restore},
       {"first_step_ms",
        std::max<std::int64_t>(0, restart - rendezvous - wait - process_start - imports - pg - restore)},
       {"warm", p.warm}};
  return t;
}

}  // namespace

DowntimeRecord DescribeDowntime(const Incident& inc, const RestartPath& path) {
  const Nanos first_step_wall = path.first_step_wall;
  // Lost work counts from the checkpoint the ranks really resumed from.
  const std::int64_t from = path.resumed_step >= 0 ? path.resumed_step : inc.checkpoint_step;
  json d = {{"incident", inc.number},
            {"failure_kind", FindingKindName(inc.kind)},
            {"detection_ms", (inc.detected_wall - inc.fault_wall) / kMillisecond},
            {"shutdown_ms", inc.stopped_wall > 0
                                ? (inc.stopped_wall - inc.detected_wall) / kMillisecond
                                : -1},
            {"restart_ms", first_step_wall > 0 && inc.stopped_wall > 0
                               ? (first_step_wall - inc.stopped_wall) / kMillisecond
                               : -1},
            {"failure_step", inc.failure_step},
            {"checkpoint_step", inc.checkpoint_step},
            {"resumed_step", path.resumed_step >= 0 ? json(path.resumed_step) : json(nullptr)},
            {"lost_steps", std::max<std::int64_t>(0, inc.failure_step - std::max<std::int64_t>(from, 0))}};
  json terms = RestartTerms(inc, path);
  if (!terms.empty()) d["restart_terms"] = terms;
  auto seconds = [&](const char* key) {
    std::int64_t ms = d[key].get<std::int64_t>();
    char buf[64];
    if (ms < 0) return std::string("unknown");
    std::snprintf(buf, sizeof(buf), "%.3f s", static_cast<double>(ms) / 1000);
    return std::string(buf);
  };
  std::string lost;
  if (inc.failure_step < 0) {
    lost = "lost work unknown: no progress data";
    d["lost_steps"] = nullptr;
  } else if (path.resumed_step >= 0) {
    lost = "lost " + std::to_string(d["lost_steps"].get<std::int64_t>()) + " step(s) (failed at " +
           std::to_string(inc.failure_step) + ", resumed from checkpoint " + std::to_string(path.resumed_step) +
           ")";
  } else if (inc.checkpoint_step < 0) {
    lost = "lost " + std::to_string(d["lost_steps"].get<std::int64_t>()) + " step(s) (failed at " +
           std::to_string(inc.failure_step) + ", no checkpoint reported: counted from step 0)";
  } else {
    lost = "lost " + std::to_string(d["lost_steps"].get<std::int64_t>()) + " step(s) (failed at " +
           std::to_string(inc.failure_step) + ", checkpoint " + std::to_string(inc.checkpoint_step) +
           ")";
  }
  DowntimeRecord r;
  r.line = "incident " + std::to_string(inc.number) + " (" + FindingKindName(inc.kind) + "): detection " +
           seconds("detection_ms") + ", shutdown " + seconds("shutdown_ms") + ", restart " +
           seconds("restart_ms") + (path.warm ? " (warm)" : "") + ", " + lost;
  if (!terms.empty()) {
    auto ms = [&](const char* key) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(terms[key].get<std::int64_t>()) / 1000);
      return std::string(buf);
    };
    r.line += "; restart = rendezvous " + ms("rendezvous_ms") +
              (terms["standby_wait_ms"].get<std::int64_t>() > 0 ? " + standby wait " + ms("standby_wait_ms") : "") +
              " + process start " + ms("process_start_ms") +
              " + imports " + ms("imports_ms") + " + process group " + ms("pg_init_ms") + " + restore " +
              ms("restore_ms") + " + first step " + ms("first_step_ms") + " s";
  }
  r.json = d.dump(-1, ' ', false, kReplaceBadUtf8);
  return r;
}

}  // namespace trainguard
