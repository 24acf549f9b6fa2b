// JobController::Resume: a controller started again on the store of a job
// whose controller died (kill -9, a crash, its host's reboot) rebuilds the
// job from its recorded events and takes back the agents that reconnect
// with their ranks still running. docs/events.md ("controller restarts").
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "controller/job_controller.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::optional<JobState> JobStateFromName(const std::string& name) {
  for (JobState s : {JobState::kStarting, JobState::kRunning, JobState::kStopping, JobState::kDiagnosing,
                     JobState::kRestarting, JobState::kSucceeded, JobState::kFailed}) {
    if (name == JobStateName(s)) return s;
  }
  return std::nullopt;
}

}  // namespace

Status JobController::Resume() {
  // The store's part, off the lock: the job's record, and what the store
  // says of nodes.
  auto events = store_->Events(config_.job_id);
  if (!events.ok()) return events.status();
  const Nanos health_read = clock_->MonotonicNanos();
  auto health = store_->ListNodeHealth();
  std::lock_guard<std::mutex> lock(mu_);
  if (health.ok()) {
    health_.Replace(NodeHealthCache::Index(std::move(health.value())), health_read);
  } else {
    ++store_read_errors_;
  }
  next_health_read_mono_ = health_read + config_.health_refresh;
  if (events->empty() || events->front().kind != "job_created") {
    return NotFound("job " + config_.job_id + " is not in the store: nothing to resume");
  }
  // The checkpoint plan's prior and exposure as its first controller had them.
  if (json created = json::parse(events->front().detail_json, nullptr, false);
      created.is_object() && created.contains("failure_prior_from") && created["knobs"].is_object() &&
      created["knobs"].contains("failure_prior")) {
    const json& per_1000 = created["knobs"]["failure_prior"];
    const double rate = per_1000.is_string() ? std::atof(per_1000.get<std::string>().c_str())
                                             : per_1000.is_number() ? per_1000.get<double>() : 0;
    if (rate > 0) checkpoints_.UseFleetPrior(rate / 1000, created.value("failure_prior_from", std::string()));
  }
  checkpoints_.Begin(clock_->MonotonicNanos() - std::max<Nanos>(0, clock_->WallNanos() - events->front().wall_ns));
  JobState last = JobState::kStarting;
  Nanos last_wall = 0;
  std::map<std::string, int> slot_of;  // the running generation's nodes, by their registrations
  std::map<std::string, int> registered_as;
  std::map<std::string, json> named_stragglers;  // unit -> its straggler event's detail, until cleared
  std::int64_t layout_generation = -1;           // the newest generation whose layout was recorded
  bool round_open = false;                       // a diagnosis round started and not decided
  std::set<std::string> started_here;            // nodes that reported the generation's ranks started
  for (const Event& e : *events) {
    last_wall = std::max(last_wall, e.wall_ns);
    const std::optional<EventKind> kind = EventKindFromName(e.kind);
    if (!kind) continue;  // a newer controller's kind: nothing of it to rebuild
    // Each kind's part of the job's status; the others are history only.
    json d;
    auto detail = [&]() -> const json& {
      if (d.is_null()) {
        d = json::parse(e.detail_json, nullptr, false);
        if (!d.is_object()) d = json::object();
      }
      return d;
    };
    if (SdcMonitor::Replays(*kind)) sdc_.Replay(*kind, e.generation, e.step, detail());
    switch (*kind) {
      case EventKind::kState:
        if (auto s = JobStateFromName(detail().value("to", ""))) last = *s;
        break;
      case EventKind::kGenerationStarted: {
        // Recorded before the agents are told to start, and followed by the
        // state change to RUNNING: a controller killed between the two left
        // a generation whose ranks may run. It is taken back as running (its
        // nodes come back with their ranks), not restarted once more.
        last = JobState::kRunning;
        generation_ = e.generation;
        restart_count_ = detail().value("restart_count", restart_count_);
        active_nnodes_ = detail().value("nnodes", active_nnodes_);
        generation_start_wall_ = e.wall_ns;
        named_stragglers.clear();
        started_here.clear();
        first_step_seen_ = false;
        first_step_wall_ = 0;
        first_step_no_ = -1;
        slot_of.clear();
        // The generation's nodes as decided (recorded since the decision is
        // made durable before it is acted on); ranks_started confirms them.
        const json group_ranks = detail().value("group_ranks", json::object());
        for (const auto& [node, slot] : group_ranks.items()) {
          if (slot.is_number_integer()) slot_of[node] = slot.get<int>();
        }
        break;
      }
      case EventKind::kStraggler:
      case EventKind::kStragglerCleared:
        if (e.generation == generation_ && detail().value("unit", json()).is_string()) {
          const std::string unit = d["unit"].get<std::string>();
          if (*kind == EventKind::kStraggler) {
            named_stragglers[unit] = d;
          } else {
            named_stragglers.erase(unit);
          }
        }
        break;
      case EventKind::kFirstStep:
        if (e.generation == generation_) {
          first_step_seen_ = true;
          first_step_wall_ = detail().value("first_step_unix_ms", std::int64_t{0}) * kMillisecond;
          first_step_no_ = detail().value("first_step", e.step);
        }
        break;
      case EventKind::kCheckpointCommitted:
        checkpoint_step_ = std::max(checkpoint_step_, e.step);
        break;
      case EventKind::kCheckpointPlan: {
        CheckpointPlan plan;
        plan.memory_interval_s = detail().value("memory_interval_s", 0.0);
        plan.storage_interval_s = detail().value("storage_interval_s", 0.0);
        plan.job_mtbf_s = detail().value("job_mtbf_s", 0.0);
        plan.storage_mtbf_s = detail().value("storage_mtbf_s", 0.0);
        plan.expected_overhead = detail().value("expected_overhead", 0.0);
        plan.basis = e.message.rfind("checkpoint plan: ", 0) == 0 ? e.message.substr(17) : e.message;
        checkpoints_.RestoreSent(plan, detail().value("saves", std::int64_t{0}), detail().value("save_cost_s", -1.0));
        break;
      }
      case EventKind::kDowntime: {
        const std::int64_t resumed = detail().value("resumed_step", json()).is_number_integer()
                                         ? d["resumed_step"].get<std::int64_t>()
                                         : -1;
        checkpoints_.ObserveIncident(resumed >= 0 && resumed < detail().value("checkpoint_step", std::int64_t{-1}));
        break;
      }
      case EventKind::kFailure:
        incident_count_ = std::max(incident_count_ + 1, detail().value("incident", 0));
        break;
      case EventKind::kDecision:
        // The policy's memory as of its last decision (recovery_policy.h).
        if (!detail().contains("policy")) break;
        if (auto memory = PolicyMemory::FromJson(d["policy"].dump()); memory.ok()) {
          policy_.Restore(std::move(memory.value()));
        } else {
          std::fprintf(stderr, "trainguard: warning: %s (event %lld); the policy starts without it\n",
                       memory.status().message().c_str(), static_cast<long long>(e.id));
        }
        break;
      case EventKind::kLayout:
        layout_generation = detail().value("generation", layout_generation);
        break;
      case EventKind::kDiagnosisStarted:
        round_open = true;  // until its verdict
        break;
      case EventKind::kDiagnosis:
        round_open = false;
        if (detail().value("purpose", "") == "preflight") preflight_done_ = true;
        break;
      case EventKind::kNodeRegistered:
      case EventKind::kNodeReconnected:
      case EventKind::kSparePromoted:
      case EventKind::kNodeReassigned:
        if (detail().contains("group_rank")) registered_as[e.node] = d.value("group_rank", -1);
        break;
      case EventKind::kRanksStarted:
        if (e.generation == generation_) {
          started_here.insert(e.node);
          // The group rank is in the event since controller restarts exist;
          // before, it is the one the node registered with (or moved to).
          int slot = detail().value("group_rank", registered_as.count(e.node) ? registered_as[e.node] : -1);
          if (slot >= 0) slot_of[e.node] = slot;
        }
        break;
      case EventKind::kGroupRanksRenumbered: {
        const json moved = detail().value("moved", json::object());  // items() does not keep a temporary alive
        for (const auto& [node, ranks] : moved.items()) {
          if (ranks.is_array() && ranks.size() == 2) registered_as[node] = ranks[1].get<int>();
        }
        break;
      }
      default:
        break;  // history only
    }
  }
  if (last == JobState::kSucceeded || last == JobState::kFailed) {
    return FailedPrecondition("job " + config_.job_id + " has ended (" + JobStateName(last) + "): nothing to resume");
  }
  started_ = true;
  preflight_done_ = preflight_done_ || generation_ >= 0;
  const Nanos now = clock_->MonotonicNanos();
  waiting_since_mono_ = now;
  resumed_from_ = last;
  std::string plan;
  if (last == JobState::kRunning && generation_ >= 0) {
    // The ranks may still run: their agents get reconnect_window to come back.
    state_ = JobState::kRunning;
    resuming_ = true;
    resume_deadline_mono_ = now + config_.reconnect_window;
    std::vector<ReportedStraggler> reported;
    for (const auto& [unit, d] : named_stragglers) {
      const std::int64_t first = d.value("first_step", std::int64_t{0});
      reported.push_back({unit, StragglerSignalFromName(d.value("signal", "")), first,
                          d.value("last_step", first), d.value("evict", false)});
    }
    telemetry_.Resume(generation_, active_nnodes_ * config_.nproc_per_node, reported, layout_generation);
    sdc_.FinishReplay(generation_, active_nnodes_ * config_.nproc_per_node);
    unstarted_.clear();
    for (const auto& [node_id, slot] : slot_of) {
      if (!started_here.count(node_id)) unstarted_.insert(node_id);
      Node n;
      n.node_id = node_id;
      n.group_rank = slot;
      n.stopped_generation = -1;
      nodes_.Add(n);
    }
    plan = "waiting up to " + std::to_string(config_.reconnect_window / kSecond) + " s for the agents of generation " +
           std::to_string(generation_) + " to reconnect with their ranks";
  } else if (generation_ < 0) {
    // Nothing ran yet: agents register as at a first start. A preflight
    // round its predecessor had not decided is run again.
    state_ = JobState::kStarting;
    plan = "no ranks ran yet: the job starts when its nodes register" +
           std::string(round_open ? ", after its preflight diagnosis, run again" : "");
  } else if (last == JobState::kDiagnosing && round_open) {
    // It died diagnosing the nodes after an incident (the verdict's
    // evictions made): the round is run again once the nodes are back, and
    // the job restarts after it, once.
    state_ = JobState::kRestarting;
    rediagnose_ = true;
    plan = "generation " + std::to_string(generation_) +
           " is stopped; its nodes are diagnosed again when they are back, then the job restarts";
  } else {
    // It died mid-recovery: the ranks were being stopped or restarted. The
    // restart is finished once the nodes are back.
    state_ = JobState::kRestarting;
    restart_count_ = std::max(restart_count_, static_cast<int>(generation_) + 1);
    plan = std::string("it was ") + JobStateName(last) + ": generation " + std::to_string(generation_) +
           " is stopped and the job restarts when its nodes are back";
  }
  Emit(EventKind::kControllerRestarted, "", -1, -1,
       "the controller restarted (its job was " + std::string(JobStateName(last)) + ", last event " +
           std::to_string((clock_->WallNanos() - last_wall) / kMillisecond) + " ms ago): " + plan,
       json{{"previous_state", JobStateName(last)},
            {"generation", generation_},
            {"restart_count", restart_count_},
            {"last_event_unix_ms", last_wall / kMillisecond},
            {"reconnect_window_ms", config_.reconnect_window / kMillisecond},
            {"nodes", slot_of}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
  if (state_ == JobState::kRestarting && restart_count_ > config_.max_restarts) {
    Finish(JobState::kFailed, "job " + config_.job_id + " FAILED: the controller restarted during a restart that "
                                  "exceeds --max-restarts " + std::to_string(config_.max_restarts));
  }
  for (const auto& [conn, reg] : early_registrations_) HandleRegister(conn, reg);
  early_registrations_.clear();
  Reconcile();  // the same loop as every tick's, from the rebuilt status
  return Status::Ok();
}

bool JobController::ResumeNode(std::uint64_t conn, const std::shared_ptr<AgentLink>& link, const v1::Register& reg,
                               v1::ControllerMessage* welcome) {
  // Running, or stopping for an incident that opened before every node was
  // back (a rank died while no controller led): a node back with its ranks
  // then joins the stop, and its exits join the incident.
  if (!resuming_ || (state_ != JobState::kRunning && state_ != JobState::kStopping)) return false;
  auto placeholder = std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) {
    return n.node_id == reg.node_id() && n.conn == 0 && n.group_rank >= 0;
  });
  if (placeholder == nodes_.end()) return false;
  const bool with_its_ranks = reg.has_resume_generation() && reg.resume_generation() == generation_ &&
                              reg.resume_group_rank() == placeholder->group_rank;
  // No ranks of the generation, none recorded as started here either: its
  // Start never went out (the controller died between recording the
  // generation and sending it). Nothing of it ran: not a loss.
  const bool never_started = !with_its_ranks && unstarted_.count(reg.node_id()) > 0 &&
                             (!reg.has_resume_generation() || reg.resume_generation() < generation_);
  if (!with_its_ranks && !never_started) {
    // It is back without the ranks it ran (its agent restarted too): they
    // are lost, and so is the generation.
    NodeLost(&*placeholder,
             "its agent came back after the controller restarted without the ranks of generation " +
                 std::to_string(generation_),
             clock_->WallNanos());
    return false;
  }
  Node& node = *placeholder;
  node.conn = conn;
  telemetry_.Joined(conn, node.node_id);
  node.link = link;
  node.runs_diagnostics = reg.runs_diagnostics();
  node.diag_port = reg.diag_port();
  node.memory_port = reg.memory_port();
  node.rack = reg.rack();
  node.address = reg.address();
  node.free_port = reg.free_port();
  node.last_heartbeat_mono = clock_->MonotonicNanos();
  node.last_heartbeat_wall = clock_->WallNanos();
  node.ranks.clear();
  node.hang_deadline = 0;  // its ranks come from the registration, not UpdateRank: look at them
  json pids = json::object();
  if (with_its_ranks) {
    for (const auto& status : reg.resume_ranks()) {
      RankView& view = node.ranks[status.global_rank()];
      view.status = status;
      view.received_mono = clock_->MonotonicNanos();
      pids[std::to_string(status.global_rank())] = status.pid();
    }
  } else if (state_ == JobState::kStopping) {
    node.stopped_generation = generation_;  // nothing of it ran here: nothing to stop
  } else {
    came_back_unstarted_.insert(node.node_id);
  }
  // Not resumed: the agent stops what it still holds of an older generation.
  welcome->mutable_welcome()->set_resumed(with_its_ranks);
  if (rules_ != nullptr) welcome->mutable_welcome()->set_scan_rules(scan_rules_json_);
  link->Send(*welcome);
  if (with_its_ranks && state_ == JobState::kStopping) {
    link->Send(stop_);  // the Stop the others got; its stop_timeout counts from now
    stop_sent_mono_ = clock_->MonotonicNanos();
  }
  Emit(EventKind::kNodeReconnected, node.node_id, -1, -1,
       "node " + node.node_id + " (" + reg.hostname() + ", " + reg.address() + ") reconnected " +
           (with_its_ranks ? "with its " + std::to_string(reg.resume_ranks_size()) + " rank(s) of generation " +
                                 std::to_string(generation_)
                           : "without ranks: generation " + std::to_string(generation_) +
                                 " was recorded but its Start never reached it"),
       json{{"hostname", reg.hostname()}, {"address", reg.address()}, {"agent_pid", reg.pid()},
            {"group_rank", node.group_rank}, {"pids", pids}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
  // Ranks that exited while the controller was away are reported by the
  // agent right after this (RankExited), and handled as any exit.
  bool all_back = true;
  int members = 0;
  for (const auto& n : nodes_) {
    all_back &= n.group_rank < 0 || n.conn != 0;
    members += n.group_rank >= 0 ? 1 : 0;
  }
  if (all_back) FinishResume(members);
  return true;
}

void JobController::FinishResume(int members) {
  resuming_ = false;
  if (state_ != JobState::kRunning) {
    // An incident opened while nodes were still away: every one is back
    // and stopping; the restart that follows starts every node.
    came_back_unstarted_.clear();
    return;
  }
  if (came_back_unstarted_.empty()) {
    Emit(EventKind::kJobResumed, "", -1, -1,
         "every node of generation " + std::to_string(generation_) + " is back: the job goes on without a restart",
         json{{"generation", generation_}}.dump(-1, ' ', false, kReplaceBadUtf8));
    return;
  }
  if (static_cast<int>(came_back_unstarted_.size()) == members) {
    // No rank of it ran anywhere: it is started now, as decided (the same
    // generation and restart count), without an incident.
    came_back_unstarted_.clear();
    Emit(EventKind::kJobResumed, "", -1, -1,
         "every node of generation " + std::to_string(generation_) +
             " is back; its Starts never went out before the controller restarted: it is started now",
         json{{"generation", generation_}, {"started_again", true}}.dump(-1, ' ', false, kReplaceBadUtf8));
    waiting_since_mono_ = clock_->MonotonicNanos();
    generation_recorded_ = true;  // its generation_started is in the store already
    SetState(JobState::kRestarting, "generation " + std::to_string(generation_) + " was never started");
    return;
  }
  // Some nodes run the generation, some never got it: it cannot go on.
  std::vector<std::string> unstarted(came_back_unstarted_.begin(), came_back_unstarted_.end());
  came_back_unstarted_.clear();
  for (const auto& id : unstarted) {
    Node* n = nodes_.ById(id);
    if (n != nullptr && n->group_rank >= 0 && state_ == JobState::kRunning) {
      NodeLost(n, "its agent came back after the controller restarted without the ranks of generation " +
                      std::to_string(generation_), clock_->WallNanos());
    }
  }
}

void JobController::CheckResumeDeadline() {
  if (!resuming_ || clock_->MonotonicNanos() < resume_deadline_mono_) return;
  resuming_ = false;
  came_back_unstarted_.clear();  // the missing nodes' loss restarts the generation anyway
  std::vector<std::string> missing;
  for (const auto& n : nodes_) {
    if (n.group_rank >= 0 && n.conn == 0) missing.push_back(n.node_id);
  }
  for (const auto& id : missing) {
    if (Node* n = nodes_.ById(id); n != nullptr && n->group_rank >= 0 && n->conn == 0) {
      NodeLost(n, "its agent did not reconnect within " + std::to_string(config_.reconnect_window / kSecond) +
                      " s of the controller's restart",
               clock_->WallNanos());
    }
  }
}

}  // namespace trainguard
