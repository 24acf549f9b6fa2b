#include "controller/downtime.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"

namespace trainguard {

using nlohmann::json;

DowntimeRecord DescribeDowntime(const Incident& inc, Nanos first_step_wall) {
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
            {"lost_steps", std::max<std::int64_t>(
                               0, inc.failure_step - std::max<std::int64_t>(inc.checkpoint_step, 0))}};
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
           seconds("restart_ms") + ", " + lost;
  r.json = d.dump(-1, ' ', false, kReplaceBadUtf8);
  return r;
}

}  // namespace trainguard
