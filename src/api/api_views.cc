#include "api/api_views.h"

#include <map>

#include "store/step_timing_text.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::int64_t UnixMs(Nanos wall) { return wall / kMillisecond; }

json Detail(const std::string& text) {
  json d = json::parse(text, nullptr, false);
  return d.is_discarded() ? json::object() : d;
}

}  // namespace

LiveJob LiveJobOf(const JobSnapshot& job) {
  // Step times arrive with heartbeats: a running job whose newest step is
  // within two heartbeats of now is taken to be stepping now, so that its
  // productive time does not lag by up to a heartbeat.
  Nanos newest = job.newest_step_unix_ms * kMillisecond;
  if (job.state == "RUNNING" && !job.incident_open && newest > 0 &&
      job.now_wall - newest <= 2 * job.heartbeat_interval) {
    newest = job.now_wall;
  }
  LiveJob live{job.now_wall,          job.state, job.restart_count, newest, job.checkpoint_overhead_ms,
               job.checkpoint_wait_ms, job.data_wait_ms};
  live.generation = job.generation;
  live.first_step_wall = job.generation_first_step_unix_ms * kMillisecond;
  live.first_step_no = job.generation_first_step;
  live.checkpoint_saves = job.checkpoint_saves;
  return live;
}

json JobJson(const JobSnapshot& job, const JobRecord* record, const DowntimeReport* report) {
  json j = {{"job_id", job.job_id},
            {"state", job.state},
            {"finished", job.finished},
            {"nnodes", job.nnodes},
            {"active_nnodes", job.active_nnodes},
            {"nproc_per_node", job.nproc_per_node},
            {"world_size", job.active_nnodes * job.nproc_per_node},
            {"restart_count", job.restart_count},
            {"max_restarts", job.max_restarts},
            {"generation", job.generation},
            {"step", job.max_step},
            {"checkpoint_step", job.checkpoint_step},
            {"steps_per_second", job.step_rate},
            {"incidents", job.incidents},
            {"incident_open", job.incident_open},
            {"last_failure", job.last_failure},
            {"summary", job.summary},
            {"now_unix_ms", UnixMs(job.now_wall)}};
  if (record != nullptr) {
    j["command"] = record->command;
    j["created_unix_ms"] = UnixMs(record->created_wall_ns);
    j["config"] = Detail(record->config_json);
  }
  j["ettr"] = report != nullptr && report->has_progress ? json(report->ettr) : json(nullptr);
  j["wall_s"] = report != nullptr ? json(report->wall_s) : json(nullptr);
  return j;
}

json NodesJson(const JobSnapshot& job, const std::vector<NodeHealth>& health,
               const std::vector<DiagnosticsRecord>& diagnostics) {
  std::map<std::string, const NodeHealth*> health_of;
  for (const auto& h : health) health_of[h.node] = &h;
  std::map<std::string, const DiagnosticsRecord*> diag_of;
  for (const auto& d : diagnostics) diag_of[d.node] = &d;
  json out = json::array();
  for (const NodeSnapshot& n : job.nodes) {
    json node = {{"node_id", n.node_id},
                 {"group_rank", n.group_rank},
                 {"role", n.role},
                 {"connected", n.connected},
                 {"address", n.address},
                 {"rack", n.rack},
                 {"heartbeat_age_s", n.heartbeat_age_s >= 0 ? json(n.heartbeat_age_s) : json(nullptr)},
                 {"straggler", n.straggler}};
    json ranks = json::array();
    for (const RankSnapshot& r : job.ranks) {
      if (r.node == n.node_id) ranks.push_back(r.rank);
    }
    node["ranks"] = ranks;
    if (auto h = health_of.find(n.node_id); h != health_of.end() && !h->second->status.empty()) {
      node["health"] = {{"status", h->second->status},
                        {"reason", h->second->reason},
                        {"job_id", h->second->job_id},
                        {"unix_ms", UnixMs(h->second->wall_ns)}};
    } else {
      node["health"] = {{"status", "ok"}, {"reason", ""}, {"job_id", ""}, {"unix_ms", nullptr}};
    }
    if (auto d = diag_of.find(n.node_id); d != diag_of.end()) {
      json figures = json::parse(d->second->figures_json, nullptr, false);
      node["diagnostics"] = {{"unix_ms", UnixMs(d->second->wall_ns)},
                             {"mode", d->second->mode},
                             {"job_id", d->second->job_id},
                             {"figures", figures.is_discarded() ? json::array() : figures}};
    } else {
      node["diagnostics"] = nullptr;
    }
    out.push_back(node);
  }
  return out;
}

json RanksJson(const JobSnapshot& job) {
  json out = json::array();
  for (const RankSnapshot& r : job.ranks) {
    out.push_back({{"rank", r.rank},
                   {"local_rank", r.local_rank},
                   {"node", r.node},
                   {"pid", r.pid},
                   {"running", r.running},
                   {"instrumented", r.attached},
                   {"step", r.step},
                   {"step_count", r.step_count},
                   {"phase", r.phase},
                   {"phase_age_ms", r.phase_age_ms},
                   {"progress_age_ms", r.progress_age_ms},
                   {"checkpoint_step", r.checkpoint_step},
                   {"last_step_unix_ms", r.last_step_unix_ms},
                   {"waiting_in", r.waiting_in},
                   {"waiting_ms", r.waiting_ms}});
  }
  return out;
}

json EventJson(const Event& e) {
  return {{"id", e.id},
          {"unix_ms", UnixMs(e.wall_ns)},
          {"kind", e.kind},
          {"node", e.node},
          {"rank", e.rank},
          {"generation", e.generation},
          {"step", e.step},
          {"message", e.message},
          {"detail", Detail(e.detail_json)}};
}

json TimingsJson(const std::vector<StepTimingRecord>& rows) {
  json out = json::array();
  for (const StepTimingRecord& row : rows) {
    json totals = json::object();
    if (auto t = DecodeTotals(row.totals); t.ok()) {
      for (const auto& [k, us] : *t) totals[k] = us;
    }
    out.push_back({{"generation", row.generation},
                   {"rank", row.rank},
                   {"node", row.node},
                   {"step", row.step},
                   {"start_us", row.start_us},
                   {"duration_us", row.duration_us},
                   {"clock_error_us", row.clock_error_us},
                   {"totals_us", totals}});
  }
  return out;
}

json StragglersJson(const JobSnapshot& job, const std::vector<Event>& events) {
  json now = json::array();
  for (const NodeSnapshot& n : job.nodes) {
    if (n.straggler) now.push_back(n.node_id);
  }
  json findings = json::array();
  for (const Event& e : events) {
    if (e.kind == "straggler" || e.kind == "straggler_cleared" || e.kind == "straggler_baseline" ||
        e.kind == "slow_trend") {
      findings.push_back(EventJson(e));
    }
  }
  return {{"stragglers", now}, {"findings", findings}};
}

}  // namespace trainguard
