#include "report/downtime_report.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "common/clock.h"

namespace trainguard {

using nlohmann::json;

namespace {

// What the culprit nodes' own signals said of a verdict read from log lines
// (controller/corroboration.h): "node1: heartbeat: GPU 1: Xid 79 (1 new)",
// "nothing of node1's own agrees (suspected)"; "" when none was needed.
std::string CorroborationLine(const json& inc) {
  const json c = inc.value("corroboration", json::object());
  if (!c.is_object() || !c.value("log_only", false)) return "";
  std::string out;
  const json support = c.value("support", json::object());
  for (const auto& [node, lines] : support.items()) {
    if (!lines.is_array() || lines.empty() || !lines[0].is_string()) continue;
    out += (out.empty() ? "" : "; ") + node + ": " + lines[0].get<std::string>();
  }
  std::string none;
  const json unsupported = c.value("unsupported", json::array());
  for (const auto& n : unsupported) {
    if (n.is_string()) none += (none.empty() ? "" : ", ") + n.get<std::string>();
  }
  if (!none.empty()) out += (out.empty() ? "" : "; ") + std::string("nothing of ") + none + "'s own agrees (suspected)";
  return out;
}

double Sec(Nanos ns) { return static_cast<double>(ns) / kSecond; }
Nanos FromMs(const json& j, const char* key) {
  return j.contains(key) ? j[key].get<std::int64_t>() * kMillisecond : 0;
}

struct Generation {
  Nanos first_step = 0;        // wall time of its first step, 0 if none
  std::int64_t first_step_no = -1;
};

}  // namespace

StatusOr<DowntimeReport> ComputeReport(const std::string& job_id, const std::vector<Event>& events,
                                       const LiveJob* live) {
  DowntimeReport r;
  r.job_id = job_id;
  Nanos start = 0, end = 0, final_last_step = 0;
  bool live_end = false;  // `end` is now: the job runs on
  double final_ckpt_s = 0, final_ckpt_wait_s = 0, final_data_wait_s = 0;
  std::int64_t final_saves = 0;  // rank 0's saves, as the job's end (or the live job) counts them
  std::map<std::int64_t, Generation> gens;
  struct Failure {
    json detail;
    std::int64_t generation;
    Nanos stopped = 0;
    json attribution, decision;
  };
  std::vector<Failure> failures;
  std::map<int, std::int64_t> resumed_from;  // incident -> the checkpoint step its restart resumed from
  std::int64_t saves = 0;
  json plan;  // the newest checkpoint plan's detail
  for (const auto& e : events) {
    if (e.kind == "checkpoint_committed") ++saves;
    // Only these kinds' details are read: a job of 12,500 nodes records
    // 12,500 other events at each restart.
    const bool read = e.kind == "first_step" || e.kind == "failure" || e.kind == "attribution" ||
                      e.kind == "decision" || e.kind == "downtime" || e.kind == "job_succeeded" ||
                      e.kind == "job_failed" || e.kind == "checkpoint_plan";
    if (!read && e.kind != "job_created" && e.kind != "stopped") continue;
    // A hang's location (every rank's wait: megabytes at 100,000 ranks) is
    // not read here.
    static const json::parser_callback_t skip_location = [](int depth, json::parse_event_t event, json& parsed) {
      return !(depth == 1 && event == json::parse_event_t::key && parsed == "location");
    };
    json d = read ? json::parse(e.detail_json, skip_location, false) : json::object();
    if (d.is_discarded()) d = json::object();
    if (e.kind == "job_created") start = e.wall_ns;
    if (e.kind == "checkpoint_plan") plan = d;
    if (e.kind == "first_step") {
      gens[e.generation] = {FromMs(d, "first_step_unix_ms"), d.value("first_step", e.step)};
    }
    if (e.kind == "failure") failures.push_back({d, e.generation, 0, json(), json()});
    if (e.kind == "stopped" && !failures.empty()) failures.back().stopped = e.wall_ns;
    if (e.kind == "attribution" && !failures.empty()) failures.back().attribution = d;
    if (e.kind == "decision" && !failures.empty()) failures.back().decision = d;
    // The checkpoint the ranks really resumed from, known at the restart: a
    // save may commit between the failure and the stop.
    if (e.kind == "downtime" && d.value("resumed_step", json()).is_number_integer()) {
      resumed_from[d.value("incident", 0)] = d["resumed_step"].get<std::int64_t>();
    }
    if (e.kind == "job_succeeded" || e.kind == "job_failed") {
      end = e.wall_ns;
      r.state = e.kind == "job_succeeded" ? "SUCCEEDED" : "FAILED";
      r.restarts = d.value("restart_count", 0);
      final_last_step = FromMs(d, "last_step_unix_ms");
      final_ckpt_s = d.value("checkpoint_overhead_ms", 0.0) / 1000;
      final_ckpt_wait_s = d.value("checkpoint_wait_ms", 0.0) / 1000;
      final_data_wait_s = d.value("data_wait_ms", 0.0) / 1000;
      final_saves = d.value("checkpoint_saves", std::int64_t{0});
    }
  }
  if (live != nullptr && live->generation >= 0 && live->first_step_wall > 0 && !gens.count(live->generation)) {
    gens[live->generation] = {live->first_step_wall, live->first_step_no};
  }
  if (start == 0) return NotFound("no job_created event for job " + job_id);
  if (end == 0 && live != nullptr) {
    end = std::max(live->now_wall, start);
    live_end = true;
    r.state = live->state;
    r.restarts = live->restarts;
    final_last_step = std::min(live->last_step_wall, end);
    final_ckpt_s = live->checkpoint_overhead_ms / 1000;
    final_ckpt_wait_s = live->checkpoint_wait_ms / 1000;
    final_data_wait_s = live->data_wait_ms / 1000;
    final_saves = live->checkpoint_saves;
  }
  if (end == 0) return FailedPrecondition("job " + job_id + " has not ended yet (or its controller died)");
  r.wall_s = Sec(end - start);
  auto first_of = [&](std::int64_t g) { return gens.count(g) ? gens[g].first_step : 0; };
  Nanos first0 = first_of(0);
  // Before the first step of generation 0; if it never stepped, all is startup.
  Nanos startup_end = first0 > 0 ? first0 : (failures.empty() ? end : FromMs(failures[0].detail, "fault_unix_ms"));
  r.startup_s = Sec(startup_end - start);

  for (size_t i = 0; i < failures.size(); ++i) {
    const json& d = failures[i].detail;
    std::int64_t g = failures[i].generation;
    Nanos fault = FromMs(d, "fault_unix_ms");
    Nanos detected = FromMs(d, "detected_unix_ms");
    Nanos last_step = FromMs(d, "last_step_unix_ms");
    std::int64_t fail_step = d.value("failure_step", -1LL), ckpt = d.value("checkpoint_step", -1LL);
    const int number = d.value("incident", static_cast<int>(i + 1));
    if (auto resumed = resumed_from.find(number); resumed != resumed_from.end()) ckpt = resumed->second;
    Nanos first = first_of(g);
    double productive = 0, lost = 0;
    std::int64_t lost_steps = 0;
    if (first > 0 && fault > first) {
      // Steps of this generation ran from `first` to `last_step` at an even
      // pace; work up to the checkpoint step was kept, the rest was lost.
      std::int64_t first_no = gens[g].first_step_no;
      Nanos kept_until = first;
      if (ckpt >= first_no && fail_step > first_no && last_step > first) {
        double per_step = static_cast<double>(last_step - first) / static_cast<double>(fail_step - first_no);
        kept_until = first + static_cast<Nanos>(per_step * static_cast<double>(ckpt - first_no));
        kept_until = std::min(kept_until, std::max(last_step, first));
      }
      productive = Sec(kept_until - first);
      lost = Sec(fault - kept_until);
      lost_steps = std::max<std::int64_t>(0, fail_step - std::max(ckpt, first_no - 1));
    }
    Nanos stopped = failures[i].stopped > 0 ? failures[i].stopped : detected;
    // The restart runs until the next generation's first step, or, if that
    // generation failed before stepping, until its fault; or to the job's end.
    Nanos next = 0;
    bool restart_open = false;  // no first step known yet: restarting until now
    if (first_of(g + 1) > 0) {
      next = first_of(g + 1);
    } else if (i + 1 < failures.size()) {
      next = FromMs(failures[i + 1].detail, "fault_unix_ms");
    } else {
      next = end;
      restart_open = live_end;
    }
    double detection = Sec(detected - fault), shutdown = Sec(stopped - detected);
    double restart = Sec(std::max<Nanos>(0, next - stopped));
    // Checkpoint time of this generation: the part inside the kept work is
    // overhead; the part inside the lost work is already counted as lost.
    double ckpt_s = d.value("checkpoint_overhead_ms", 0.0) / 1000;
    double ckpt_wait_s = d.value("checkpoint_wait_ms", 0.0) / 1000;
    double data_wait_s = d.value("data_wait_ms", 0.0) / 1000;
    const double kept = productive + lost > 0 ? productive / (productive + lost) : 1;
    ckpt_s = std::min(ckpt_s * kept, productive);
    productive -= ckpt_s;
    r.checkpoint_s += ckpt_s;
    r.checkpoint_wait_s += std::min(ckpt_wait_s * kept, ckpt_s);
    r.data_wait_s += std::min(data_wait_s * kept, productive);
    r.productive_s += productive;
    r.lost_s += lost;
    r.lost_steps += lost_steps;
    r.detection_s += detection;
    r.shutdown_s += shutdown;
    r.restart_s += restart;
    json inc = {{"incident", number},
                {"failure_kind", d.value("failure_kind", "")},
                {"generation", g},
                {"failure_step", fail_step},
                {"checkpoint_step", ckpt},
                {"lost_steps", lost_steps},
                {"lost_s", lost},
                {"detection_s", detection},
                {"shutdown_s", shutdown},
                {"restart_s", restart},
                {"restart_open", restart_open}};
    const json& a = failures[i].attribution;
    if (a.is_object()) {
      for (const char* k : {"category", "hardware", "persistence", "confidence", "culprit_ranks",
                            "culprit_nodes", "culprit_evidence", "rule", "description", "evidence",
                            "answered_by", "determined", "acting_threshold", "confidence_from_log", "corroboration",
                            "suspected_nodes"}) {
        if (a.contains(k)) inc[k] = a[k];
      }
    }
    if (failures[i].decision.is_object()) {
      inc["decision"] = failures[i].decision.value("decision", "");
      inc["reason"] = failures[i].decision.value("reason", "");
    }
    r.incidents.push_back(inc);
  }
  // The generation that ran last, after the last restart (if it stepped).
  std::int64_t last_gen = gens.empty() ? -1 : gens.rbegin()->first;
  bool last_failed = !failures.empty() && failures.back().generation >= last_gen;
  if (last_gen >= 0 && !last_failed && first_of(last_gen) > 0) {
    Nanos last = std::max(final_last_step, first_of(last_gen));
    double kept = Sec(last - first_of(last_gen));
    double ckpt_s = std::min(final_ckpt_s, kept);
    r.checkpoint_s += ckpt_s;
    r.productive_s += kept - ckpt_s;
    r.checkpoint_wait_s += std::min(final_ckpt_wait_s, ckpt_s);
    r.data_wait_s += std::min(final_data_wait_s, kept - ckpt_s);
    r.tail_s = Sec(end - last);
  } else if (failures.empty() && first0 > 0) {
    r.tail_s = Sec(end - first0);
  }
  r.ettr = r.wall_s > 0 ? r.productive_s / r.wall_s : 0;
  r.has_progress = !gens.empty();
  // The commits the controller recorded miss saves that came faster than
  // heartbeats; rank 0's own count (trainguard.Checkpointer only) does not.
  r.checkpoints = ComputeCheckpointCost(r, std::max(saves, final_saves), static_cast<int>(failures.size()), plan);
  return r;
}

json ReportJson(const DowntimeReport& r) {
  double downtime =
      r.startup_s + r.lost_s + r.detection_s + r.shutdown_s + r.restart_s + r.tail_s + r.checkpoint_s;
  return {{"job_id", r.job_id},
          {"state", r.state},
          {"restarts", r.restarts},
          {"wall_s", r.wall_s},
          {"progress_data", r.has_progress},
          {"productive_s", r.has_progress ? json(r.productive_s) : json(nullptr)},
          {"ettr", r.has_progress ? json(r.ettr) : json(nullptr)},
          {"downtime",
           {{"startup_s", r.startup_s},
            {"lost_work_s", r.lost_s},
            {"lost_steps", r.lost_steps},
            {"detection_s", r.detection_s},
            {"shutdown_s", r.shutdown_s},
            {"restart_s", r.restart_s},
            {"tail_s", r.tail_s},
            {"checkpoint_overhead_s", r.checkpoint_s},
            {"total_s", downtime}}},
          // Storage's share, inside the terms above: of checkpoint_overhead_s
          // and of productive_s.
          {"storage",
           {{"checkpoint_wait_s", r.checkpoint_wait_s},
            {"data_wait_s", r.data_wait_s},
            {"named", !StorageLine(r).empty()},
            {"line", StorageLine(r)}}},
          {"checkpoints", CheckpointCostJson(r.checkpoints)},
          {"incidents", r.incidents}};
}

std::string StorageLine(const DowntimeReport& r) {
  std::string line;
  char buf[200];
  if (r.data_wait_s > 0 && r.productive_s > 0 && r.data_wait_s >= 0.2 * r.productive_s) {
    std::snprintf(buf, sizeof(buf), "the data loader held the job %.2f s (%.0f %% of the kept step time)",
                  r.data_wait_s, 100 * r.data_wait_s / r.productive_s);
    line += buf;
  }
  if (r.checkpoint_wait_s > 0 && r.checkpoint_s > 0 && r.checkpoint_wait_s >= 0.1 * r.checkpoint_s) {
    std::snprintf(buf, sizeof(buf),
                  "checkpoint saves waited %.2f s (%.0f %% of the checkpoint overhead) for the previous "
                  "save's write to storage",
                  r.checkpoint_wait_s, 100 * r.checkpoint_wait_s / r.checkpoint_s);
    line += std::string(line.empty() ? "" : "; ") + buf;
  }
  return line.empty() ? "" : "storage: " + line;
}

std::string ReportText(const DowntimeReport& r) {
  std::string out;
  char buf[512];
  if (r.has_progress) {
    std::snprintf(buf, sizeof(buf),
                  "job %s: %s after %d restart(s); wall %.2f s, productive %.2f s, ETTR %.1f%%\n",
                  r.job_id.c_str(), r.state.c_str(), r.restarts, r.wall_s, r.productive_s,
                  100 * r.ettr);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "job %s: %s after %d restart(s); wall %.2f s; no progress data (no rank reported "
                  "a step), so productive time, lost work and ETTR are unknown\n",
                  r.job_id.c_str(), r.state.c_str(), r.restarts, r.wall_s);
  }
  out += buf;
  if (!r.incidents.empty()) out += "\nincidents\n";
  for (const auto& inc : r.incidents) {
    std::string culprit;
    for (const auto& c : inc.value("culprit_ranks", json::array())) {
      culprit += (culprit.empty() ? "rank " : ", rank ") + std::to_string(c.get<int>());
    }
    std::string nodes;
    for (const auto& n : inc.value("culprit_nodes", json::array())) {
      nodes += (nodes.empty() ? "" : ", ") + n.get<std::string>();
    }
    if (inc.value("determined", true)) {
      std::snprintf(buf, sizeof(buf), "  #%d %s: %s (%s, %s), confidence %.2f\n",
                    inc.value("incident", 0), inc.value("failure_kind", "").c_str(),
                    inc.value("category", "unattributed").c_str(),
                    inc.value("hardware", false) ? "hardware" : "software",
                    inc.value("persistence", "unknown").c_str(), inc.value("confidence", 0.0));
    } else {
      std::snprintf(buf, sizeof(buf), "  #%d %s: undetermined (best reading %s, confidence %.2f below %.2f)\n",
                    inc.value("incident", 0), inc.value("failure_kind", "").c_str(),
                    inc.value("category", "unattributed").c_str(), inc.value("confidence", 0.0),
                    inc.value("acting_threshold", 0.0));
    }
    out += buf;
    out += "     culprit:  " + (culprit.empty() ? std::string("unknown") : culprit) +
           (nodes.empty() ? "" : " on " + nodes) +
           (inc.value("culprit_evidence", "").empty() ? "" : " (" + inc.value("culprit_evidence", "") + ")") + "\n";
    out += "     decision: " + inc.value("decision", std::string("-")) + ": " +
           inc.value("reason", std::string("")) + "\n";
    if (std::string c = CorroborationLine(inc); !c.empty()) out += "     corroboration: " + c + "\n";
    int shown = 0;
    for (const auto& e : inc.value("evidence", json::array())) {
      if (shown++ == 3) break;
      std::string line = e.value("line", "");
      if (line.size() > 160) line = line.substr(0, 157) + "...";
      out += "     evidence: [" + e.value("role", "") + "] " + line + "\n";
    }
    std::snprintf(buf, sizeof(buf),
                  "     downtime: detection %.2f s, lost %.2f s (%lld steps), shutdown %.2f s, "
                  "restart %.2f s\n",
                  inc.value("detection_s", 0.0), inc.value("lost_s", 0.0),
                  static_cast<long long>(inc.value("lost_steps", 0LL)), inc.value("shutdown_s", 0.0),
                  inc.value("restart_s", 0.0));
    out += buf;
  }
  if (!r.has_progress) {
    std::snprintf(buf, sizeof(buf),
                  "\nwhere the time went: unknown without progress data; detection %.2f s and "
                  "shutdown %.2f s of the incidents are known\n",
                  r.detection_s, r.shutdown_s);
    return out + buf;
  }
  double downtime =
      r.startup_s + r.lost_s + r.detection_s + r.shutdown_s + r.restart_s + r.tail_s + r.checkpoint_s;
  std::snprintf(buf, sizeof(buf),
                "\nwhere the time went (s)\n"
                "  productive (kept step time)     %8.2f\n"
                "  startup (launch -> first step)  %8.2f\n"
                "  lost work (%3lld steps)           %8.2f\n"
                "  detection                       %8.2f\n"
                "  shutdown                        %8.2f\n"
                "  restart (stopped -> first step) %8.2f\n"
                "  tail (last step -> end)         %8.2f\n"
                "  checkpoint overhead             %8.2f\n"
                "  total downtime                  %8.2f  = wall %.2f - productive %.2f\n",
                r.productive_s, r.startup_s, static_cast<long long>(r.lost_steps), r.lost_s,
                r.detection_s, r.shutdown_s, r.restart_s, r.tail_s, r.checkpoint_s, downtime, r.wall_s,
                r.productive_s);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "  of productive, waiting for data %8.2f\n"
                "  of checkpoint, waiting for the previous save's write %.2f\n",
                r.data_wait_s, r.checkpoint_wait_s);
  out += buf;
  if (std::string storage = StorageLine(r); !storage.empty()) out += storage + "\n";
  if (std::string checkpoints = CheckpointCostLine(r.checkpoints); !checkpoints.empty()) out += checkpoints + "\n";
  return out;
}

}  // namespace trainguard
