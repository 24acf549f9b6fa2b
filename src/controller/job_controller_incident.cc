// JobController: one incident from its finding to its decision. Fail opens it
// and stops every rank; once all stopped, it is blamed off the lock
// (recovery_policy: a detector's verdict as it stands, else the rules over
// its lines, and other jobs' history), Decide asks the policy, and CarryOut
// acts on its typed Verdict: restart, evict or stop.
#include "controller/job_controller.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/utf8.h"
#include "controller/corroboration.h"
#include "controller/describe.h"
#include "controller/downtime.h"
#include "controller/fleet_history.h"
#include "controller/off_lock_runner.h"

namespace trainguard {

using nlohmann::json;

void JobController::Fail(const Finding& f) {
  if (state_ != JobState::kRunning) return;
  const std::string kind = FindingKindName(f.kind);
  const std::string& description = f.description;
  if (incident_) RecordDowntime(RestartPath{});  // the previous restart never reached a step
  Incident inc;
  inc.number = ++incident_count_;
  inc.kind = f.kind;
  inc.verdict = f.verdict;
  inc.description = description;
  inc.fault_wall = f.fault_wall;
  inc.detected_wall = clock_->WallNanos();
  inc.detected_mono = clock_->MonotonicNanos();
  inc.failure_step = MaxStep();
  inc.checkpoint_step = checkpoint_step_;
  inc.generation = generation_;
  inc.first_rank = f.rank;
  inc.first_node = f.node;
  inc.first_rank_step = f.rank_step;
  inc.hung_ranks = f.hung_ranks;
  inc.hang_roots = f.roots;
  inc.hang_evidence = f.culprit_evidence;
  for (const auto& line : f.lines) inc.AddLine(line);
  inc.verdict_lines = f.lines;
  // A verdict without lines of its own (the SDC monitor's) rests on what it says.
  if (inc.verdict_lines.empty() && f.verdict) inc.verdict_lines.push_back({f.rank, f.node, "trainguard: " + f.description});
  if (f.rank >= 0 && f.kind == FindingKind::kRankFailed) inc.exit_times[f.rank] = f.fault_wall;
  for (const auto& n : nodes_) {
    for (const auto& [r, view] : n.ranks) {
      inc.last_step_wall = std::max<Nanos>(inc.last_step_wall, view.status.last_step_unix_ms() * kMillisecond);
    }
  }
  incident_ = inc;
  last_failure_ = description;
  last_failure_status_ = 1;
  if (f.kind == FindingKind::kRankFailed) {
    last_failure_status_ = f.signal != 0 ? 128 + f.signal : (f.exit_code > 0 ? f.exit_code : 1);
  }
  json d = json::parse(f.detail_json, nullptr, false);
  if (d.is_discarded() || !d.is_object()) d = json::object();
  d["failure_kind"] = kind;
  d["incident"] = inc.number;
  d["fault_unix_ms"] = f.fault_wall / kMillisecond;
  d["detected_unix_ms"] = inc.detected_wall / kMillisecond;
  d["detection_ms"] = (inc.detected_wall - f.fault_wall) / kMillisecond;
  d["failure_step"] = inc.failure_step;
  d["checkpoint_step"] = inc.checkpoint_step;
  d["last_step_unix_ms"] = inc.last_step_wall / kMillisecond;
  d["checkpoint_overhead_ms"] = CheckpointOverheadMs();
  d["checkpoint_wait_ms"] = CheckpointWaitMs();
  d["data_wait_ms"] = telemetry_.DataWaitMs();
  Emit(EventKind::kFailure, f.node, f.rank, inc.failure_step,
       "incident " + std::to_string(inc.number) + ": " + kind + ": " + description, d.dump(-1, ' ', false, kReplaceBadUtf8));

  SetState(JobState::kStopping, "stopping all ranks after " + kind);
  stop_sent_mono_ = clock_->MonotonicNanos();
  stop_.Clear();
  stop_.mutable_stop()->set_generation(generation_);
  stop_.mutable_stop()->set_reason(kind + ": " + description);
  stop_.mutable_stop()->set_grace_ms(static_cast<int>(config_.stop_grace / kMillisecond));
  for (int r : f.capture_stacks_of) stop_.mutable_stop()->add_capture_stacks_of(r);
  for (auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) n.link->Send(stop_);
  }
}

void JobController::MaybeAllStopped() {
  if (state_ != JobState::kStopping) return;
  if (!awaiting_explanation_.empty()) return;  // the backend has not said yet why the node was lost
  if (blaming_ != 0) return;                   // every rank stopped; the blame is on its way
  // Every Stopped asks: resume the scan where the last one found a node
  // still running (a scan from the start each time is quadratic: 78 million
  // node visits per restart at 12,500 nodes), then confirm from the start.
  // After a restart of the controller, a member whose agent has not
  // reconnected yet still runs its ranks as far as anyone knows; its exits
  // (the first rank to die, perhaps) come when it is back. It is awaited
  // until then or until the reconnect window declares it lost.
  auto running = [&](const Node& n) {
    return n.group_rank >= 0 && n.stopped_generation != generation_ && (n.conn != 0 || resuming_);
  };
  for (std::size_t i = std::min(stop_scan_hint_, nodes_.size()); i < nodes_.size(); ++i) {
    if (running(nodes_[i])) {
      stop_scan_hint_ = i;
      return;
    }
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (running(nodes_[i])) {
      stop_scan_hint_ = i;
      return;
    }
  }
  stop_scan_hint_ = 0;
  Nanos now_wall = clock_->WallNanos();
  if (incident_) {
    incident_->stopped_wall = now_wall;
    Emit(EventKind::kStopped, "", -1, -1,
         "all ranks of generation " + std::to_string(generation_) + " stopped " +
             Seconds(now_wall - incident_->detected_wall) + " after detection",
         json{{"shutdown_ms", (now_wall - incident_->detected_wall) / kMillisecond}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  if (incident_) {
    BlameOffLock();  // comes back to Decide and CarryOut
  } else {
    CarryOut(Verdict{});
  }
}

void JobController::BlameOffLock() {
  Incident& live = *incident_;
  blaming_ = live.number;
  // The work takes the lines (moved: two million of them at 100,000 ranks)
  // and a copy of the rest; lines that arrive meanwhile follow them back.
  std::vector<LogLine> lines = std::move(live.lines);
  live.lines.clear();
  auto snapshot = std::make_shared<Incident>(live);
  snapshot->lines = std::move(lines);
  std::map<int, std::string> rank_nodes;
  for (const auto& n : nodes_) {
    for (const auto& [rank, view] : n.ranks) rank_nodes[rank] = n.node_id;
  }
  const RuleSet* rules = rules_;
  blame_->Run([this, snapshot, rules, rank_nodes = std::move(rank_nodes)]() -> OffLockRunner::Apply {
    Blame b = AssignBlame(rules, *snapshot, [&](int rank) {
      auto it = rank_nodes.find(rank);
      return it == rank_nodes.end() ? std::string() : it->second;
    });
    FleetFinding fleet = ReadFleet(b);
    // The cordons as they are now: the restart evicts nodes an operator
    // cordoned during the job (EvictCordonedNodes).
    const Nanos health_read = clock_->MonotonicNanos();
    auto health = store_->ListNodeHealth();
    if (!health.ok()) ++store_read_errors_;
    auto rows = std::make_shared<NodeHealthCache::Rows>(
        health.ok() ? NodeHealthCache::Index(std::move(health.value())) : NodeHealthCache::Rows{});
    const bool read = health.ok();
    return [this, snapshot, b, fleet, rows, read, health_read] {
      if (read) health_.Replace(std::move(*rows), health_read);
      if (!incident_ || incident_->number != snapshot->number || blaming_ != snapshot->number) return;  // ended meanwhile
      blaming_ = 0;
      std::vector<LogLine> later = std::move(incident_->lines);
      incident_->lines = std::move(snapshot->lines);
      incident_->lines.insert(incident_->lines.end(), later.begin(), later.end());
      if (state_ != JobState::kStopping) return;
      CarryOut(Decide(b, fleet));
    };
  });
  TakeOffLockResults();  // an inline runner (unit tests) has blamed it already
}

void JobController::CarryOut(const Verdict& verdict) {
  const std::string& why = verdict.why;
  if (restart_count_ >= config_.max_restarts) {
    Finish(JobState::kFailed,
           "job " + config_.job_id + " FAILED after " + std::to_string(restart_count_) +
               " restart(s) (--max-restarts " + std::to_string(config_.max_restarts) +
               "); last failure: " + last_failure_ + (why.empty() ? "" : "; " + why));
    return;
  }
  if (verdict.decision == Decision::kStop) {
    Finish(JobState::kFailed, "job " + config_.job_id + " FAILED: " + why +
                                  " (after " + std::to_string(restart_count_) + " restart(s))");
    return;
  }
  Restart(verdict);
}

Verdict JobController::Decide(const Blame& b, const FleetFinding& fleet) {
  const Incident& inc = *incident_;
  // What the culprit nodes say of a verdict read from log lines: their GPU
  // errors within the suspicion window (the kernel's lines and the history
  // are in the blame and the fleet finding).
  std::map<std::string, NodeSignals> signals;
  const Nanos since = clock_->WallNanos() - config_.suspicion_window;
  int culprit_gpu = -1;
  for (const auto& id : b.culprit_nodes) {
    const Node* node = nodes_.ById(id);
    if (node == nullptr) continue;
    for (const auto& [wall, what] : node->gpu_errors) {
      if (wall >= since) signals[id].gpu_errors.push_back(what);
    }
    if (auto r = node->ranks.find(b.culprit_rank); r != node->ranks.end()) culprit_gpu = r->second.status.local_rank();
  }
  const Corroboration corroboration = Corroborate(b, inc, fleet, signals);
  Verdict v = policy_.Decide(b, inc, fleet, &corroboration, culprit_gpu);
  const Attribution& a = b.attribution;
  const char* decision_name = DecisionName(v.decision);
  json evidence = json::array();
  for (const auto& e : a.evidence) {
    evidence.push_back({{"rank", e.rank}, {"node", e.node}, {"rule", e.rule_id},
                        {"category", e.category}, {"role", e.role}, {"line", e.line}});
  }
  std::vector<std::string> nodes(b.culprit_nodes.begin(), b.culprit_nodes.end());
  json d = {{"incident", inc.number},         {"failure_kind", FindingKindName(inc.kind)},
            {"category", a.category},         {"rule", a.rule_id},
            {"description", a.description},   {"hardware", a.hardware},
            {"persistence", a.persistence},   {"confidence", a.confidence},
            {"answered_by", a.answered_by},   {"model", json::parse(ModelReadingJson(a))},
            {"culprit_ranks", b.culprit_ranks}, {"culprit_nodes", nodes},
            {"recommended_action", a.action}, {"decision", decision_name},
            {"reason", v.why},                {"history", v.history},
            {"failure_step", b.step},         {"evidence", evidence},
            {"fleet", json::parse(fleet.EvidenceJson())},
            {"first_in_time", b.first_in_time},
            {"culprit_evidence", b.culprit_evidence},
            {"corroboration", json::parse(corroboration.ToJson())},
            {"suspected_nodes", v.diagnose_nodes}};
  double confidence = a.confidence;
  if (corroboration.log_only && !corroboration.support.empty() && a.confidence < kCorroboratedConfidence) {
    // The node's own signals agree with what its ranks printed: the reading
    // is surer than the log alone made it.
    d["confidence_from_log"] = a.confidence;
    confidence = kCorroboratedConfidence;
    d["confidence"] = confidence;
  }
  // Below the acting threshold the reading is a guess: said as such
  // ("undetermined"), restarted, and its nodes diagnosed where hardware is
  // plausible (recovery_policy.cc).
  const bool determined = confidence >= config_.min_confidence;
  d["determined"] = determined;
  d["acting_threshold"] = config_.min_confidence;
  if (auto f = inc.stopped_error_files.find(b.culprit_rank); f != inc.stopped_error_files.end()) {
    d["culprit_error_file"] = json::parse(f->second, nullptr, false);  // the root cause's, where no exit carried it
  }
  Emit(EventKind::kAttribution, b.culprit_node, b.culprit_rank, b.step,
       "incident " + std::to_string(inc.number) + ": " +
           (determined ? a.category + " (" + (a.hardware ? "hardware" : "software") + ", " + a.persistence +
                             ", confidence " + std::to_string(confidence).substr(0, 4) + ")"
                       : "undetermined (best reading " + a.category + ", confidence " +
                             std::to_string(confidence).substr(0, 4) + " below " +
                             std::to_string(config_.min_confidence).substr(0, 4) + ")") +
           ", culprit " + b.CulpritText(),
       d.dump(-1, ' ', false, kReplaceBadUtf8));
  Emit(EventKind::kDecision, b.culprit_node, b.culprit_rank, b.step,
       std::string("incident ") + std::to_string(inc.number) + ": " + decision_name + ": " + v.why,
       json{{"incident", inc.number},
            {"decision", decision_name},
            {"reason", v.why},
            {"policy", json::parse(policy_.memory().ToJson())}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
  writer_->RecordIncident({config_.job_id, inc.number, clock_->WallNanos(), b.culprit_node, b.culprit_rank,
                           a.category, a.rule_id, decision_name, b.step, d.dump(-1, ' ', false, kReplaceBadUtf8)});
  if (v.decision == Decision::kEvict) {
    v.evidence_json = json{{"incident", inc.number}, {"category", a.category}, {"rule", a.rule_id},
                           {"description", a.description}, {"evidence", evidence},
                           {"corroboration", json::parse(corroboration.ToJson())}}
                          .dump(-1, ' ', false, kReplaceBadUtf8);
  }
  // Why each diagnosed node is suspected: a log's verdict nothing of its
  // own agreed with, or a reading too unsure to act on.
  const std::string suspected =
      "incident " + std::to_string(inc.number) + ": " + a.category + " (" + a.rule_id + ")" +
      (corroboration.log_only ? " from its ranks' log alone; nothing of its own agrees"
                              : ", undetermined (confidence " + std::to_string(confidence).substr(0, 4) + ")");
  for (const auto& node : v.diagnose_nodes) {
    writer_->RecordNodeAction({node, clock_->WallNanos(), "suspected", "controller of job " + config_.job_id,
                               suspected, config_.job_id, corroboration.ToJson()});
  }
  return v;
}

FleetFinding JobController::ReadFleet(const Blame& b) {
  // Other jobs' incidents in the shared store, within the suspicion window;
  // on a node, only since an operator last cleared it.
  FleetQuery q;
  q.job_id = config_.job_id;
  q.program = ProgramOf(config_.argv);
  q.since = clock_->WallNanos() - config_.suspicion_window;
  std::map<std::string, std::string> watched;
  for (const auto& n : b.culprit_nodes) {
    auto health = StoredHealthOf(n);
    if (health.ok() && health->status == "ok") q.node_since[n] = std::max(q.since, health->wall_ns);
    if (health.ok() && health->status == "watch" && health->wall_ns >= q.since) watched[n] = health->reason;
  }
  if (auto jobs = store_->Jobs(); jobs.ok()) {
    for (const auto& j : *jobs) {
      json config = json::parse(j.config_json, nullptr, false);
      if (config.is_object() && config.contains("argv") && config["argv"].is_array()) {
        std::vector<std::string> argv;
        for (const auto& arg : config["argv"]) argv.push_back(arg.is_string() ? arg.get<std::string>() : "");
        q.program_of_job[j.job_id] = ProgramOf(argv);
      }
    }
  } else {
    ++store_read_errors_;
  }
  auto incidents = store_->IncidentsOnNode("");
  if (!incidents.ok()) {
    ++store_read_errors_;
    FleetFinding fleet;
    fleet.watched_nodes = std::move(watched);
    return fleet;
  }
  FleetFinding fleet = ReadFleetHistory(b, *incidents, q);
  fleet.watched_nodes = std::move(watched);
  return fleet;
}

void JobController::RecordDowntime(const RestartPath& path) {
  if (!incident_) return;
  DowntimeRecord r = DescribeDowntime(*incident_, path);
  // Resumed from older than the newest commit: a shard's memory copies were gone.
  checkpoints_.ObserveIncident(path.resumed_step >= 0 && path.resumed_step < incident_->checkpoint_step);
  Emit(EventKind::kDowntime, "", -1, incident_->failure_step, r.line, r.json);
  incident_.reset();
}

}  // namespace trainguard
