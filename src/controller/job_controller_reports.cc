// JobController: what the agents report — rank status in heartbeats, ranks
// started and exited, stops, log alerts — and a node's connection going away.
// A rank's exit and a fatal line go through their detectors (crash_detector,
// log_alert_detector); a failure opens an incident (job_controller_incident.cc).
#include "controller/job_controller.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/utf8.h"
#include "controller/crash_detector.h"
#include "controller/describe.h"
#include "controller/gpu_health.h"
#include "controller/hang_detector.h"
#include "controller/off_lock_runner.h"
#include "controller/log_alert_detector.h"

namespace trainguard {

using nlohmann::json;

void JobController::UpdateRank(Node* node, const v1::RankStatus& reported, v1::RankStatus* owned) {
  RankView& view = node->ranks[reported.global_rank()];
  if (owned != nullptr) {
    view.status.Swap(owned);
  } else {
    view.status = reported;
  }
  const v1::RankStatus& status = view.status;
  view.received_mono = clock_->MonotonicNanos();
  view.hang_deadline = HangDeadline(view, LowestHangTimeout(config_), config_);
  node->hang_deadline = std::min(node->hang_deadline, view.hang_deadline);  // early is safe; a heartbeat makes it exact
  next_hang_check_mono_ = std::min(next_hang_check_mono_, view.hang_deadline);
  sdc_.ObserveCommit(status.checkpoint_step());
  if (status.global_rank() == 0) checkpoints_.ObserveSaves(generation_, status.checkpoint_saves(), status.checkpoint_blocked_us());
  if (status.checkpoint_step() > checkpoint_step_) {
    checkpoint_step_ = status.checkpoint_step();
    Emit(EventKind::kCheckpointCommitted, node->node_id, status.global_rank(), checkpoint_step_,
         "checkpoint of step " + std::to_string(checkpoint_step_) + " committed");
  }
  if (!first_step_seen_ && status.first_step_unix_ms() > 0 && status.has_first_step()) {
    first_step_seen_ = true;
    RestartPath path;
    path.first_step_wall = status.first_step_unix_ms() * kMillisecond;
    path.generation_start_wall = generation_start_wall_;
    path.standby_wait_ms = status.has_standby_wait_ms() ? status.standby_wait_ms() : -1;
    path.script_start_ms = status.has_script_start_ms() ? status.script_start_ms() : -1;
    path.pg_init_begin_ms = status.has_pg_init_begin_ms() ? status.pg_init_begin_ms() : -1;
    path.pg_init_end_ms = status.has_pg_init_end_ms() ? status.pg_init_end_ms() : -1;
    path.restore_begin_ms = status.has_restore_begin_ms() ? status.restore_begin_ms() : -1;
    path.restore_end_ms = status.has_restore_end_ms() ? status.restore_end_ms() : -1;
    path.first_step_ms = status.has_first_step_ms() ? status.first_step_ms() : -1;
    path.warm = status.warm();
    const std::int64_t first_step = status.first_step();
    first_step_wall_ = path.first_step_wall;
    first_step_no_ = first_step;
    // Only what the rank says it loaded: the step before its first step is
    // no proof (a loop may count from anywhere).
    path.resumed_step = status.has_resumed_step() ? status.resumed_step() : -1;
    json detail{{"first_step_unix_ms", status.first_step_unix_ms()},
                {"first_step", first_step},
                {"since_launch_ms", (path.first_step_wall - generation_start_wall_) / kMillisecond},
                {"warm", status.warm()}};
    if (path.resumed_step >= 0) detail["resumed_step"] = path.resumed_step;
    Emit(EventKind::kFirstStep, node->node_id, status.global_rank(), status.step(),
         "generation " + std::to_string(generation_) + " made its first step " +
             Seconds(path.first_step_wall - generation_start_wall_) + " after launch" +
             (status.warm() ? " (warm)" : ""),
         detail.dump(-1, ' ', false, kReplaceBadUtf8));
    RecordDowntime(path);
  }
}

void JobController::ObserveGpus(Node* node, std::vector<v1::GpuHealth> now) {
  // A GPU's error counters that grew since the last heartbeat: said at
  // once, and kept with the node (trainguard nodes), before any job fails.
  std::vector<std::string> grew = GpuErrorIncreases(node->gpus, now);
  for (const auto& g : grew) {
    node->gpu_errors.emplace_back(clock_->WallNanos(), g);
    if (node->gpu_errors.size() > 16) node->gpu_errors.pop_front();
  }
  if (!grew.empty()) {
    std::string what;
    for (const auto& g : grew) what += (what.empty() ? "" : "; ") + g;
    Emit(EventKind::kGpuErrors, node->node_id, -1, -1, "node " + node->node_id + ": " + what,
         json{{"increases", grew}}.dump(-1, ' ', false, kReplaceBadUtf8));
    writer_->RecordNodeAction({node->node_id, clock_->WallNanos(), "gpu-errors", "controller of job " + config_.job_id,
                               what, config_.job_id, json{{"increases", grew}}.dump(-1, ' ', false, kReplaceBadUtf8)});
    // Watched from now on: an incident this node is blamed for within the
    // suspicion window evicts it (recovery_policy.h), as after a hardware
    // warning line.
    auto health = HealthOf(node->node_id);
    if (health.ok() && health->status != "suspect" && health->status != "cordoned") {
      writer_->SetNodeHealth({node->node_id, "watch", "GPU errors: " + what, config_.job_id, clock_->WallNanos()});
    }
  }
  node->gpus = std::move(now);
}

void JobController::HandleHeartbeat(Node* node, const v1::Heartbeat& hb, v1::Heartbeat* owned) {
  node->last_heartbeat_mono = clock_->MonotonicNanos();
  node->last_heartbeat_wall = clock_->WallNanos();
  ObserveLinks(node, hb.metrics());
  node->standbys_ready = hb.metrics().standbys_ready();
  node->standby_rss_kb = hb.metrics().standby_rss_kb();
  node->memory_checkpoint_bytes = hb.metrics().memory_checkpoint_bytes();
  node->cpu = {hb.metrics().cpu_throttled_pct(), hb.metrics().cpu_steal_pct(), hb.metrics().load1(),
               hb.metrics().cpu_cores()};
  node->mounts.assign(hb.metrics().mounts().begin(), hb.metrics().mounts().end());
  node->tcp_retrans_pct = hb.metrics().tcp_retrans_pct();
  ObserveGpus(node, {hb.metrics().gpus().begin(), hb.metrics().gpus().end()});
  telemetry_.AddGpus(node->node_id, node->gpus);  // the GPU series (telemetry_ingest.h)
  if (hb.generation() != generation_ || state_ != JobState::kRunning) return;
  for (int i = 0; i < hb.ranks_size(); ++i) {
    SdcActions seen;
    sdc_.Observe(hb.ranks(i), &seen);
    if (!seen.empty()) CarryOutSdc(std::move(seen));
    UpdateRank(node, hb.ranks(i), owned != nullptr ? owned->mutable_ranks(i) : nullptr);
  }
  node->hang_deadline = kNoHangDeadline;  // exact again: its ranks were just looked at
  for (const auto& [rank, rv] : node->ranks) node->hang_deadline = std::min(node->hang_deadline, rv.hang_deadline);
  CheckSdc(/*after_heartbeat=*/true);
}

void JobController::HandleStarted(Node* node, const v1::RanksStarted& started, v1::RanksStarted* owned) {
  if (started.generation() != generation_) return;
  json pids = json::object();
  json warm = json::array();
  json cold = json::object();  // reason -> global ranks
  json waited = json::object();  // global rank -> ms its start waited for its standby
  std::int64_t longest_wait = 0;
  for (int i = 0; i < started.ranks_size(); ++i) {
    const v1::RankStatus& r = started.ranks(i);
    pids[std::to_string(r.global_rank())] = r.pid();
    if (r.warm()) warm.push_back(r.global_rank());
    if (!r.cold_reason().empty()) cold[r.cold_reason()].push_back(r.global_rank());
    if (r.has_standby_wait_ms()) {
      waited[std::to_string(r.global_rank())] = r.standby_wait_ms();
      longest_wait = std::max(longest_wait, r.standby_wait_ms());
    }
  }
  std::string how;
  if (!warm.empty()) how = " (" + std::to_string(warm.size()) + " warm)";
  if (!waited.empty()) {
    how += " (waited up to " + Seconds(longest_wait * kMillisecond) + " for " + std::to_string(waited.size()) +
           " standby(s) still importing)";
  }
  for (const auto& [reason, ranks] : cold.items()) {
    how += " (" + std::to_string(ranks.size()) + " cold: " + reason + ")";
  }
  json detail{{"pids", pids}, {"generation", started.generation()}, {"group_rank", node->group_rank},
              {"warm", warm}, {"cold", cold}};
  if (!waited.empty()) detail["standby_wait_ms"] = waited;
  if (started.has_memory_restore() && (started.memory_restore().files() > 0 || !started.memory_restore().problem().empty())) {  // the node came back with no copies: it fetched them from their holder
    const v1::MemoryRestore& m = started.memory_restore();
    detail["memory_restore"] = {{"from_node", m.from_node()}, {"files", m.files()}, {"bytes", m.bytes()},
                                {"ms", m.ms()}, {"problem", m.problem()}};
    char took[32];
    std::snprintf(took, sizeof(took), "%.0f", m.ms());
    how += m.problem().empty()
               ? " (checkpoint copies fetched from " + m.from_node() + "'s memory: " + std::to_string(m.files()) +
                     " file(s), " + std::to_string(m.bytes()) + " bytes in " + took + " ms)"
               : " (no checkpoint copies from " + m.from_node() + "'s memory: " + m.problem() + ")";
  }
  for (int i = 0; i < started.ranks_size(); ++i) {
    UpdateRank(node, started.ranks(i), owned != nullptr ? owned->mutable_ranks(i) : nullptr);
  }
  Emit(EventKind::kRanksStarted, node->node_id, -1, -1,
       "node " + node->node_id + " started " + std::to_string(started.ranks_size()) +
           " rank(s) of generation " + std::to_string(generation_) + how,
       detail.dump(-1, ' ', false, kReplaceBadUtf8));
}

void JobController::HandleRankExited(Node* node, const v1::RankExited& exited) {
  const v1::RankStatus& r = exited.rank();
  json d = RankJson(r);
  d["exit_code"] = r.exit_code();
  d["signal"] = r.term_signal();
  std::vector<std::string> tail(exited.log_tail().begin(), exited.log_tail().end());
  d["log_tail"] = tail;
  if (exited.kernel_lines_size() > 0) {
    d["kernel_lines"] = std::vector<std::string>(exited.kernel_lines().begin(), exited.kernel_lines().end());
  }
  if (exited.has_error()) d["error_file"] = RankErrorJson(exited.error());
  if (exited.exit_unix_ms() > 0) d["exit_unix_ms"] = exited.exit_unix_ms();
  if (exited.last_words_unix_ms() > 0) d["last_words_unix_ms"] = exited.last_words_unix_ms();
  bool current = exited.generation() == generation_ && state_ == JobState::kRunning;
  bool ok = r.exit_code() == 0 && r.term_signal() == 0;
  std::string what = "rank " + std::to_string(r.global_rank()) + " on " + node->node_id + " " +
                     DescribeExit(r) + AtStep(r.step());
  Emit(EventKind::kRankExited, node->node_id, r.global_rank(), r.step(), what, d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (exited.generation() == generation_ && incident_) incident_->rank_steps[r.global_rank()] = r.step();
  NoteFailedAt(exited);
  if (!ok && exited.generation() == generation_ && incident_ && state_ == JobState::kStopping) {
    // A rank that died on its own while the job was being stopped: its last
    // words are evidence for the attribution (usually of a symptom).
    for (const auto& line : tail) incident_->AddLine({r.global_rank(), node->node_id, line});
    if (exited.has_error()) {
      for (const auto& line : RankErrorLines(exited.error(), tail)) {
        incident_->AddLine({r.global_rank(), node->node_id, line});
      }
    }
    incident_->AddLine({r.global_rank(), node->node_id, "trainguard: " + what});
  }
  if (!current) return;
  UpdateRank(node, r);
  if (ok) {
    RankView& view = node->ranks[r.global_rank()];
    if (!view.exited_ok) ++exited_ok_ranks_;
    view.exited_ok = true;
    // Counted, and recounted only when the count says all: a pass over
    // every rank at each of 100,000 exits would take minutes.
    int done = 0;
    if (exited_ok_ranks_ >= active_nnodes_ * config_.nproc_per_node) {
      for (const auto& n : nodes_) {
        for (const auto& [rank, v] : n.ranks) done += v.exited_ok ? 1 : 0;
      }
      exited_ok_ranks_ = done;
    }
    if (done == active_nnodes_ * config_.nproc_per_node) {
      Finish(JobState::kSucceeded,
             "job " + config_.job_id + " SUCCEEDED: all " + std::to_string(done) +
                 " ranks exited 0 at step " + std::to_string(MaxStep()) + " after " +
                 std::to_string(restart_count_) + " restart(s)");
    }
    return;
  }
  std::optional<Finding> crash = DetectCrash(node->node_id, exited, clock_->WallNanos());
  if (crash) Fail(*crash);
  NoteFailedAt(exited);  // the incident this exit opened
}

void JobController::NoteFailedAt(const v1::RankExited& exited) {
  const v1::RankStatus& r = exited.rank();
  if (r.exit_code() == 0 && r.term_signal() == 0) return;
  if (exited.generation() != generation_ || !incident_ || FailedAt(exited) <= 0) return;
  incident_->exit_times[r.global_rank()] = FailedAt(exited);
}

void JobController::HandleStopped(Node* node, const v1::Stopped& stopped) {
  if (stopped.free_port() > 0) node->free_port = stopped.free_port();
  // Sampled after its ranks stopped: an Xid the failure raised a moment ago
  // is known before the blame reads the node's GPU errors.
  if (stopped.gpus_size() > 0) ObserveGpus(node, {stopped.gpus().begin(), stopped.gpus().end()});
  for (const auto& s : stopped.stacks()) {
    if (incident_ && stopped.generation() == generation_) {
      incident_->stacks[s.global_rank()] = {s.proc_state(), s.python()};
    }
    json d = {{"proc_state", s.proc_state()}, {"python", s.python()}, {"native", s.native()},
              {"wait_ms", s.wait_ms()}};
    std::string where = s.python().empty() ? "no Python stack captured" : "Python stack captured";
    Emit(EventKind::kStacks, node->node_id, s.global_rank(), -1,
         "stacks of rank " + std::to_string(s.global_rank()) + " (process state " +
             (s.proc_state().empty() ? "?" : s.proc_state()) + "): " + where,
         d.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  for (const auto& u : stopped.unkillable()) {
    // Its node holds it (and its GPU memory) until the call returns: said,
    // kept with the node, and evidence of what the rank waited for.
    std::string what = "rank " + std::to_string(u.global_rank()) + " on " + node->node_id + " (pid " +
                       std::to_string(u.pid()) + ") survived SIGKILL in state " +
                       (u.proc_state().empty() ? "?" : u.proc_state()) +
                       (u.syscall().empty() ? "" : ", blocked in " + u.syscall()) +
                       (u.on_file() ? " on a file" : "") +
                       (u.wchan().empty() ? "" : " (kernel: " + u.wchan() + ")");
    Emit(EventKind::kRankUnkillable, node->node_id, u.global_rank(), -1, what,
         json{{"pid", u.pid()}, {"proc_state", u.proc_state()}, {"wchan", u.wchan()}, {"syscall", u.syscall()},
              {"on_file", u.on_file()}}
             .dump(-1, ' ', false, kReplaceBadUtf8));
    writer_->RecordNodeAction({node->node_id, clock_->WallNanos(), "unkillable", "controller of job " + config_.job_id,
                               what, config_.job_id, "{}"});
    if (incident_ && stopped.generation() == generation_) {
      incident_->AddLine({u.global_rank(), node->node_id, "trainguard: " + what}, /*unique=*/true);
    }
  }
  if (stopped.generation() != generation_ || state_ != JobState::kStopping) return;
  if (incident_) {
    for (const auto& r : stopped.ranks()) {
      int rank = r.rank().global_rank();
      incident_->rank_steps[rank] = r.rank().step();
      // Its RankExited may have carried the same lines.
      for (const auto& line : r.log_tail()) incident_->AddLine({rank, node->node_id, line}, /*unique=*/true);
      if (r.has_error()) {  // it raised before the stop came: the cause, likely, of its peers' failures
        std::vector<std::string> tail(r.log_tail().begin(), r.log_tail().end());
        for (const auto& line : RankErrorLines(r.error(), tail)) {
          incident_->AddLine({rank, node->node_id, line}, /*unique=*/true);
        }
        incident_->stopped_error_files[rank] = RankErrorJson(r.error()).dump(-1, ' ', false, kReplaceBadUtf8);
      }
    }
    // A rank exit may have carried the same kernel lines.
    for (const auto& line : stopped.kernel_lines()) incident_->AddLine({-1, node->node_id, line}, /*unique=*/true);
  }
  node->stopped_generation = stopped.generation();
}

void JobController::HandleLogAlert(Node* node, const v1::LogAlert& alert) {
  int rank = alert.global_rank();
  std::int64_t step = -1;
  if (rank >= 0 && node->ranks.count(rank)) step = node->ranks[rank].status.step();
  std::string who = rank >= 0 ? "rank " + std::to_string(rank) + " on " + node->node_id
                              : "the kernel log of " + node->node_id;
  json d = {{"rule", alert.rule_id()}, {"severity", alert.severity()}, {"line", alert.line()},
            {"generation", alert.generation()}};
  Emit(EventKind::kLogAlert, node->node_id, rank, step,
       alert.severity() + ": " + who + ": " + alert.line() + " (rule " + alert.rule_id() + ")",
       d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (alert.severity() == "warning") {
    // A warning of a hardware rule makes the node watched unless it is
    // suspect already; others (a skipped checkpoint) are only recorded.
    bool hardware = true;  // an unknown rule: as before
    if (rules_ != nullptr) {
      for (const Rule& r : rules_->rules()) {
        if (r.id == alert.rule_id()) hardware = r.hardware;
      }
    }
    if (!hardware) return;
    auto health = HealthOf(node->node_id);
    if (health.ok() && health->status != "suspect" && health->status != "cordoned") {
      writer_->SetNodeHealth({node->node_id, "watch", "warning: " + alert.line() + " (rule " + alert.rule_id() + ")",
                              config_.job_id, clock_->WallNanos()});
    }
    return;
  }
  if (alert.generation() != generation_ || state_ != JobState::kRunning) return;
  if (auto fatal = DetectFatalLine(node->node_id, alert, step, clock_->WallNanos())) Fail(*fatal);
}

void JobController::OnDisconnect(std::uint64_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_links_.erase(conn) > 0) return;  // never registered
  Node* node = nodes_.ByConn(conn);
  if (node == nullptr) return;
  telemetry_.Left(node->conn);
  node->conn = 0;
  node->link.reset();
  if (state_ == JobState::kSucceeded || state_ == JobState::kFailed) return;
  diagnosis_.NodeGone(node->node_id, "its agent went away during the diagnostics");
  if (node->group_rank < 0) {  // an idle spare went away: no rank of the job is hit
    std::string id = node->node_id;
    Emit(EventKind::kSpareLost, id, -1, -1,
         "idle node " + id + " went away (connection to its agent closed)" +
             (provider_ != nullptr ? ": the scheduler is asked for another" : ""));
    nodes_.Remove(id);
    // The job keeps its spares: a spare's host fails while idle as often as
    // a job node's.
    ExplainAndReplace(id, "idle spare went away (connection to its agent closed)");
  } else {
    NodeLost(node, "connection to its agent closed", clock_->WallNanos());
  }
  Reconcile();
}

void JobController::NodeLost(Node* node, const std::string& why, Nanos fault_wall) {
  std::string id = node->node_id;
  int group_rank = node->group_rank;
  if (node->link) {
    std::shared_ptr<AgentLink> link = node->link;
    telemetry_.Left(node->conn);
    node->conn = 0;
    node->link.reset();
    link->Close();
  }
  node->group_rank = -1;  // its slot is free for a replacement
  Emit(EventKind::kNodeLost, id, -1, -1, "node " + id + " lost: " + why,
       json{{"reason", why}, {"group_rank", group_rank}}.dump(-1, ' ', false, kReplaceBadUtf8));
  // What the scheduler backend knows of the loss (an agent process that
  // exited while its host stayed up, Slurm's node state) outweighs the bare
  // loss: asked off the lock; the node is replaced once it has answered.
  ExplainAndReplace(id, why);
  // A replacement, or the agent itself, may come back: the slot is awaited.
  if (group_rank >= 0) given_up_slots_.erase(group_rank);
  if (state_ == JobState::kRunning) {
    Finding f;
    f.kind = FindingKind::kNodeLost;
    f.description = "node " + id + " lost: " + why;
    f.node = id;
    f.fault_wall = fault_wall;
    f.lines.push_back({-1, id, "trainguard: node " + id + " lost: " + why});
    f.detail_json = json{{"reason", why}}.dump(-1, ' ', false, kReplaceBadUtf8);
    if (provider_ != nullptr) {  // the decision waits for the backend's word
      awaiting_explanation_ = id;
      awaiting_since_mono_ = clock_->MonotonicNanos();
    }
    Fail(f);
  }
  TakeOffLockResults();  // an inline runner has answered already
}

void JobController::TakeOffLockResults() {
  for (const auto& apply : explain_->Take()) apply();
  for (const auto& apply : blame_->Take()) apply();
  starter_->Take();  // nothing to apply: its work sent the Start itself
}

void JobController::ExplainAndReplace(const std::string& id, const std::string& why) {
  if (provider_ == nullptr) return;
  explaining_[id] = why;
  NodeProvider* provider = provider_;
  explain_->Run([this, provider, id]() -> OffLockRunner::Apply {
    LossExplanation known = provider->ExplainLoss(id);
    return [this, id, known] { ApplyExplanation(id, known); };
  });
}

void JobController::ApplyExplanation(const std::string& id, const LossExplanation& known) {
  std::string why = "lost";
  if (auto it = explaining_.find(id); it != explaining_.end()) {
    why = it->second;
    explaining_.erase(it);
  }
  if (provider_ != nullptr) provider_->ReplaceNode(id, why);
  if (awaiting_explanation_ != id) return;
  awaiting_explanation_.clear();
  if (incident_) {
    const LogLine said{-1, id, "trainguard: " + known.sentence};
    if (!known.sentence.empty()) incident_->AddLine(said);
    // The backend's own judgement, not a rule's reading of its sentence;
    // the sentence is what it rests on.
    if (!incident_->verdict && known.verdict) {
      incident_->verdict = known.verdict;
      if (!known.sentence.empty()) incident_->verdict_lines.push_back(said);
    }
  }
}

}  // namespace trainguard
