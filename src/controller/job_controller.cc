#include "controller/job_controller.h"

#include "common/json_text.h"
#include "common/utf8.h"

#include "controller/crash_detector.h"
#include "controller/describe.h"
#include "controller/fleet_history.h"
#include "controller/downtime.h"
#include "controller/hang_detector.h"
#include "controller/hang_locator.h"
#include "controller/heartbeat_detector.h"
#include "controller/log_alert_detector.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace trainguard {

using nlohmann::json;

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kStarting: return "STARTING";
    case JobState::kRunning: return "RUNNING";
    case JobState::kStopping: return "STOPPING";
    case JobState::kDiagnosing: return "DIAGNOSING";
    case JobState::kRestarting: return "RESTARTING";
    case JobState::kSucceeded: return "SUCCEEDED";
    case JobState::kFailed: return "FAILED";
  }
  return "UNKNOWN";
}


JobController::JobController(JobConfig config, Clock* clock, EventStore* store,
                             NodeProvider* provider, const RuleSet* rules, EventStore* write_store)
    : config_(std::move(config)),
      rules_(rules),
      scan_rules_json_(rules != nullptr ? rules->ScanRules().ToJson() : ""),
      clock_(clock),
      store_(store),
      writer_(std::make_unique<StoreWriter>(write_store != nullptr ? write_store : store)),
      provider_(provider),
      policy_(config_.no_progress_restarts),
      link_monitor_(LinkPolicy{config_.link_flap_window, config_.link_flaps_to_evict}),
      stragglers_(config_.straggler) {}

JobController::~JobController() = default;  // writer_ drains (bounded) and stops

bool JobController::FlushStore(std::chrono::milliseconds timeout) { return writer_->Flush(timeout); }

StatusOr<NodeHealth> JobController::HealthOf(const std::string& node_id) {
  if (auto pending = writer_->PendingHealth(node_id)) return *pending;
  return store_->GetNodeHealth(node_id);
}

void JobController::SetNodeProvider(NodeProvider* provider) {
  std::lock_guard<std::mutex> lock(mu_);
  provider_ = provider;
}

Status JobController::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string command;
  for (const auto& a : config_.argv) command += (command.empty() ? "" : " ") + a;
  json cfg = {{"nnodes", config_.nnodes},
              {"min_nnodes", MinNodes()},
              {"nproc_per_node", config_.nproc_per_node},
              {"max_restarts", config_.max_restarts},
              {"heartbeat_interval_ms", config_.heartbeat_interval / kMillisecond},
              {"missed_heartbeats", config_.missed_heartbeats},
              {"hang_timeout_ms", config_.hang_timeout / kMillisecond},
              {"hang_timeout_auto", config_.hang_timeout_auto},
              {"hang_timeout_floor_ms", config_.hang_timeout_floor / kMillisecond},
              {"startup_timeout_ms", config_.startup_timeout / kMillisecond},
              {"straggler_action", config_.straggler_action},
              {"argv", config_.argv}};
  if (!config_.api_url.empty()) cfg["api_url"] = config_.api_url;
  TG_RETURN_IF_ERROR(store_->CreateJob(
      {config_.job_id, clock_->WallNanos(), ValidUtf8(command), cfg.dump(-1, ' ', false, kReplaceBadUtf8), "STARTING", ""}));
  waiting_since_mono_ = clock_->MonotonicNanos();
  Emit("job_created", "", -1, -1,
       "job " + config_.job_id + ": " + std::to_string(config_.nnodes) + " node(s) x " +
           std::to_string(config_.nproc_per_node) + " rank(s): " + command,
       cfg.dump(-1, ' ', false, kReplaceBadUtf8));
  started_ = true;
  for (const auto& [conn, reg] : early_registrations_) HandleRegister(conn, reg);
  early_registrations_.clear();
  return Status::Ok();
}

JobState JobController::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

int JobController::restart_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restart_count_;
}

int JobController::FailureExitStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_failure_status_;
}

std::string JobController::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return summary_;
}

bool JobController::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == JobState::kSucceeded || state_ == JobState::kFailed;
}

bool JobController::WaitFinished(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return finished_cv_.wait_for(lock, timeout, [&] {
    return state_ == JobState::kSucceeded || state_ == JobState::kFailed;
  });
}

JobController::Node* JobController::NodeByConn(std::uint64_t conn) {
  for (auto& n : nodes_) {
    if (n.conn == conn && conn != 0) return &n;
  }
  return nullptr;
}

JobController::Node* JobController::NodeById(const std::string& id) {
  for (auto& n : nodes_) {
    if (n.node_id == id) return &n;
  }
  return nullptr;
}

void JobController::OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink> link) {
  std::lock_guard<std::mutex> lock(mu_);
  // The node is not known until it registers; remember the link under a
  // placeholder so that Register can find it.
  Node pending;
  pending.conn = conn;
  pending.link = std::move(link);
  nodes_.push_back(std::move(pending));
}

void JobController::OnMessage(std::uint64_t conn, const v1::AgentMessage& msg) {
  std::lock_guard<std::mutex> lock(mu_);
  if (msg.has_register_()) {
    if (!started_) {
      early_registrations_.emplace_back(conn, msg.register_());
    } else {
      HandleRegister(conn, msg.register_());
    }
    return;
  }
  Node* node = NodeByConn(conn);
  if (node == nullptr || node->node_id.empty()) return;  // not registered: ignore
  switch (msg.kind_case()) {
    case v1::AgentMessage::kHeartbeat: HandleHeartbeat(node, msg.heartbeat()); break;
    case v1::AgentMessage::kStarted: HandleStarted(node, msg.started()); break;
    case v1::AgentMessage::kRankExited: HandleRankExited(node, msg.rank_exited()); break;
    case v1::AgentMessage::kStopped: HandleStopped(node, msg.stopped()); break;
    case v1::AgentMessage::kLogAlert: HandleLogAlert(node, msg.log_alert()); break;
    case v1::AgentMessage::kDiagnostics: HandleDiagnostics(node, msg.diagnostics()); break;
    case v1::AgentMessage::kTimings: HandleTimings(node, msg.timings()); break;
    case v1::AgentMessage::kClockEcho: HandleClockEcho(node, msg.clock_echo()); break;
    default: break;
  }
}

void JobController::MaybeStartGeneration() {
  if (state_ != JobState::kStarting && state_ != JobState::kRestarting) return;
  PromoteSpares();
  std::vector<Node*> slots(config_.nnodes, nullptr);
  for (auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) slots[n.group_rank] = &n;
  }
  std::vector<int> empty;
  for (int g = 0; g < config_.nnodes; ++g) {
    if (slots[g] == nullptr) empty.push_back(g);
  }
  if (!empty.empty() && !MayStartWithout(empty)) return;
  waiting_said_.clear();
  if (state_ == JobState::kStarting && config_.diagnose != "off" && !preflight_done_) {
    StartDiagnosis("preflight");
    return;
  }
  if (!empty.empty()) RenumberGroupRanks(&slots);
  const int previous_nnodes = active_nnodes_;
  active_nnodes_ = static_cast<int>(slots.size());
  if (previous_nnodes > 0 && active_nnodes_ != previous_nnodes) {
    Emit("world_resized", "", -1, -1,
         "the job goes on with " + std::to_string(active_nnodes_) + " of " + std::to_string(config_.nnodes) +
             " nodes (was " + std::to_string(previous_nnodes) + "): world size " +
             std::to_string(active_nnodes_ * config_.nproc_per_node),
         json{{"nnodes", active_nnodes_}, {"previous_nnodes", previous_nnodes}, {"max_nnodes", config_.nnodes},
              {"min_nnodes", MinNodes()}, {"world_size", active_nnodes_ * config_.nproc_per_node}}
             .dump(-1, ' ', false, kReplaceBadUtf8));
  }
  generation_ = restart_count_;
  first_step_seen_ = false;
  stragglers_.Reset(active_nnodes_ * config_.nproc_per_node);
  timing_rows_this_generation_ = 0;
  layout_next_try_rows_ = 0;
  generation_start_wall_ = clock_->WallNanos();
  const Node* master = slots[0];
  v1::ControllerMessage msg;
  v1::Start* start = msg.mutable_start();
  start->set_generation(generation_);
  start->set_run_id(config_.job_id);
  start->set_nnodes(active_nnodes_);
  start->set_nproc_per_node(config_.nproc_per_node);
  start->set_world_size(active_nnodes_ * config_.nproc_per_node);
  start->set_master_addr(master->address);
  start->set_master_port(master->free_port);
  start->set_max_restarts(config_.max_restarts);
  start->set_no_instrument(config_.no_instrument);
  for (const auto& a : config_.argv) start->add_argv(a);
  for (const auto& [k, v] : config_.env) (*start->mutable_env())[k] = v;
  json group_ranks = json::object();
  for (Node* n : slots) group_ranks[n->node_id] = n->group_rank;
  json d = {{"master_addr", master->address}, {"master_port", master->free_port},
            {"restart_count", restart_count_}, {"nnodes", active_nnodes_}, {"group_ranks", group_ranks}};
  // The decision is in the store before it is acted on: a controller killed
  // after this point resumes this generation, not the one before it.
  StoreWriter::Ticket decided =
      Emit("generation_started", "", -1, -1,
           "started generation " + std::to_string(generation_) + " (restart " + std::to_string(restart_count_) + "/" +
               std::to_string(config_.max_restarts) + "), master " + master->address + ":" +
               std::to_string(master->free_port),
           d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (!writer_->WaitDurable(decided, kDurableStartWait)) {
    std::fprintf(stderr, "trainguard: generation %lld starts before the store has its record (the store is slow or "
                         "away; the record follows)\n", static_cast<long long>(generation_));
  }
  for (Node* n : slots) {
    start->set_group_rank(n->group_rank);
    n->ranks.clear();
    n->stopped_generation = -1;
    n->last_heartbeat_mono = clock_->MonotonicNanos();
    n->link->Send(msg);
  }
  SetState(JobState::kRunning, "generation " + std::to_string(generation_) + " started");
}

void JobController::UpdateRank(Node* node, const v1::RankStatus& status) {
  RankView& view = node->ranks[status.global_rank()];
  view.status = status;
  view.received_mono = clock_->MonotonicNanos();
  if (status.checkpoint_step() > checkpoint_step_) {
    checkpoint_step_ = status.checkpoint_step();
    Emit("checkpoint_committed", node->node_id, status.global_rank(), checkpoint_step_,
         "checkpoint of step " + std::to_string(checkpoint_step_) + " committed");
  }
  if (!first_step_seen_ && status.first_step_unix_ms() > 0) {
    first_step_seen_ = true;
    Nanos first_wall = status.first_step_unix_ms() * kMillisecond;
    Emit("first_step", node->node_id, status.global_rank(), status.step(),
         "generation " + std::to_string(generation_) + " made its first step " +
             Seconds(first_wall - generation_start_wall_) + " after launch",
         json{{"first_step_unix_ms", status.first_step_unix_ms()},
              // The step number of the first step: steps are counted, so
              // this holds when the loop steps one at a time.
              {"first_step", status.step() - std::max<std::int64_t>(status.step_count(), 1) + 1},
              {"since_launch_ms", (first_wall - generation_start_wall_) / kMillisecond}}
             .dump(-1, ' ', false, kReplaceBadUtf8));
    RecordDowntime(first_wall);
  }
}

void JobController::HandleHeartbeat(Node* node, const v1::Heartbeat& hb) {
  node->last_heartbeat_mono = clock_->MonotonicNanos();
  node->last_heartbeat_wall = clock_->WallNanos();
  ObserveLinks(node, hb.metrics());
  if (hb.generation() != generation_ || state_ != JobState::kRunning) return;
  for (const auto& r : hb.ranks()) UpdateRank(node, r);
}

void JobController::HandleStarted(Node* node, const v1::RanksStarted& started) {
  if (started.generation() != generation_) return;
  json pids = json::object();
  for (const auto& r : started.ranks()) {
    pids[std::to_string(r.global_rank())] = r.pid();
    UpdateRank(node, r);
  }
  Emit("ranks_started", node->node_id, -1, -1,
       "node " + node->node_id + " started " + std::to_string(started.ranks_size()) +
           " rank(s) of generation " + std::to_string(generation_),
       json{{"pids", pids}, {"generation", started.generation()}, {"group_rank", node->group_rank}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
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
  bool current = exited.generation() == generation_ && state_ == JobState::kRunning;
  bool ok = r.exit_code() == 0 && r.term_signal() == 0;
  std::string what = "rank " + std::to_string(r.global_rank()) + " on " + node->node_id + " " +
                     DescribeExit(r) + AtStep(r.step());
  Emit("rank_exited", node->node_id, r.global_rank(), r.step(), what, d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (exited.generation() == generation_ && incident_) incident_->rank_steps[r.global_rank()] = r.step();
  if (!ok && exited.generation() == generation_ && incident_ && exited.exit_unix_ms() > 0) {
    incident_->exit_times[r.global_rank()] = exited.exit_unix_ms() * kMillisecond;
  }
  if (!ok && exited.generation() == generation_ && incident_ && state_ == JobState::kStopping) {
    // A rank that died on its own while the job was being stopped: its last
    // words are evidence for the attribution (usually of a symptom).
    for (const auto& line : tail) incident_->lines.push_back({r.global_rank(), node->node_id, line});
    if (exited.has_error()) {
      for (const auto& line : RankErrorLines(exited.error(), tail)) {
        incident_->lines.push_back({r.global_rank(), node->node_id, line});
      }
    }
    incident_->lines.push_back({r.global_rank(), node->node_id, "trainguard: " + what});
  }
  if (!current) return;
  UpdateRank(node, r);
  if (ok) {
    node->ranks[r.global_rank()].exited_ok = true;
    int done = 0;
    for (const auto& n : nodes_) {
      for (const auto& [rank, view] : n.ranks) done += view.exited_ok ? 1 : 0;
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
}

void JobController::HandleStopped(Node* node, const v1::Stopped& stopped) {
  if (stopped.free_port() > 0) node->free_port = stopped.free_port();
  for (const auto& s : stopped.stacks()) {
    if (incident_ && stopped.generation() == generation_) {
      incident_->stacks[s.global_rank()] = {s.proc_state(), s.python()};
    }
    json d = {{"proc_state", s.proc_state()}, {"python", s.python()}, {"native", s.native()}};
    std::string where = s.python().empty() ? "no Python stack captured" : "Python stack captured";
    Emit("stacks", node->node_id, s.global_rank(), -1,
         "stacks of rank " + std::to_string(s.global_rank()) + " (process state " +
             (s.proc_state().empty() ? "?" : s.proc_state()) + "): " + where,
         d.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  if (stopped.generation() != generation_ || state_ != JobState::kStopping) return;
  if (incident_) {
    for (const auto& r : stopped.ranks()) {
      int rank = r.rank().global_rank();
      incident_->rank_steps[rank] = r.rank().step();
      for (const auto& line : r.log_tail()) {
        bool seen = false;  // its RankExited may have carried the same lines
        for (const auto& l : incident_->lines) seen |= l.rank == rank && l.text == line;
        if (!seen) incident_->lines.push_back({rank, node->node_id, line});
      }
    }
    for (const auto& line : stopped.kernel_lines()) {
      bool seen = false;  // a rank exit may have carried the same lines
      for (const auto& l : incident_->lines) seen |= l.node == node->node_id && l.text == line;
      if (!seen) incident_->lines.push_back({-1, node->node_id, line});
    }
  }
  node->stopped_generation = stopped.generation();
  MaybeAllStopped();
}

void JobController::HandleLogAlert(Node* node, const v1::LogAlert& alert) {
  int rank = alert.global_rank();
  std::int64_t step = -1;
  if (rank >= 0 && node->ranks.count(rank)) step = node->ranks[rank].status.step();
  std::string who = rank >= 0 ? "rank " + std::to_string(rank) + " on " + node->node_id
                              : "the kernel log of " + node->node_id;
  json d = {{"rule", alert.rule_id()}, {"severity", alert.severity()}, {"line", alert.line()},
            {"generation", alert.generation()}};
  Emit("log_alert", node->node_id, rank, step,
       alert.severity() + ": " + who + ": " + alert.line() + " (rule " + alert.rule_id() + ")",
       d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (alert.severity() == "warning") {
    // A warning makes the node watched unless it is suspect already.
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
  Node* node = NodeByConn(conn);
  if (node == nullptr) return;
  if (node->node_id.empty()) {  // never registered
    nodes_.erase(std::find_if(nodes_.begin(), nodes_.end(),
                              [&](const Node& n) { return n.conn == conn; }));
    return;
  }
  node->conn = 0;
  node->link.reset();
  if (state_ == JobState::kSucceeded || state_ == JobState::kFailed) return;
  if (diagnosis_) diagnosis_->NodeGone(node->node_id, "its agent went away during the diagnostics");
  if (node->group_rank < 0) {  // an idle spare (or an evicted node) went away: no rank of the job is hit
    std::string id = node->node_id;
    Emit("spare_lost", id, -1, -1, "idle node " + id + " went away (connection to its agent closed)");
    nodes_.erase(std::find_if(nodes_.begin(), nodes_.end(), [&](const Node& n) { return n.node_id == id; }));
    return;
  }
  NodeLost(node, "connection to its agent closed", clock_->WallNanos());
}

void JobController::NodeLost(Node* node, const std::string& why, Nanos fault_wall) {
  std::string id = node->node_id;
  int group_rank = node->group_rank;
  if (node->link) {
    std::shared_ptr<AgentLink> link = node->link;
    node->conn = 0;
    node->link.reset();
    link->Close();
  }
  node->group_rank = -1;  // its slot is free for a replacement
  Emit("node_lost", id, -1, -1, "node " + id + " lost: " + why,
       json{{"reason", why}, {"group_rank", group_rank}}.dump(-1, ' ', false, kReplaceBadUtf8));
  // What the scheduler backend knows of the loss (an agent process that
  // exited while its host stayed up) outweighs the bare loss.
  std::string known = provider_ != nullptr ? provider_->ExplainLoss(id) : "";
  if (provider_ != nullptr) provider_->ReplaceNode(id, why);
  // A replacement, or the agent itself, may come back: the slot is awaited.
  if (group_rank >= 0) given_up_slots_.erase(group_rank);
  if (state_ == JobState::kRunning) {
    Finding f;
    f.kind = FindingKind::kNodeLost;
    f.description = "node " + id + " lost: " + why;
    f.node = id;
    f.fault_wall = fault_wall;
    f.lines.push_back({-1, id, "trainguard: node " + id + " lost: " + why});
    if (!known.empty()) f.lines.push_back({-1, id, "trainguard: " + known});
    f.detail_json = json{{"reason", why}}.dump(-1, ' ', false, kReplaceBadUtf8);
    Fail(f);
  } else if (state_ == JobState::kStopping) {
    MaybeAllStopped();
  }
}

void JobController::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  Nanos now = clock_->MonotonicNanos();
  ProbeClocks();
  CheckResumeDeadline();
  switch (state_) {
    case JobState::kRunning:
      CheckHeartbeats();
      if (state_ == JobState::kRunning) {
        if (std::optional<Finding> hang = DetectHang(View(), config_)) {
          AttachLocation(LocateHang(View()), &*hang);
          Fail(*hang);
        }
      }
      break;
    case JobState::kStopping:
      CheckHeartbeats();
      if (state_ == JobState::kStopping && now - stop_sent_mono_ > config_.stop_timeout) {
        for (auto& n : nodes_) {
          if (n.conn != 0 && n.group_rank >= 0 && n.stopped_generation != generation_) {
            NodeLost(&n, "did not report its ranks stopped within " + Seconds(config_.stop_timeout),
                     clock_->WallNanos());
          }
        }
      }
      break;
    case JobState::kDiagnosing:
      if (diagnosis_) {
        diagnosis_->CheckTimeouts(now);
        SendDiagnosisOrders();
        MaybeFinishDiagnosis();
      }
      break;
    case JobState::kStarting:
    case JobState::kRestarting:
      if (MinNodes() < config_.nnodes) MaybeStartGeneration();  // the elastic wait may be over
      if ((state_ == JobState::kStarting || state_ == JobState::kRestarting) &&
          now - waiting_since_mono_ > config_.rendezvous_timeout) {
        int present = 0;
        for (const auto& n : nodes_) present += (n.conn != 0 && n.group_rank >= 0) ? 1 : 0;
        std::string evicted;
        for (const auto& n : nodes_) {
          if (n.conn == 0 && n.group_rank < 0) evicted += (evicted.empty() ? "" : ", ") + n.node_id;
        }
        Finish(JobState::kFailed, "job " + config_.job_id + " FAILED: only " +
                                      std::to_string(present) + " of " +
                                      std::to_string(config_.nnodes) + " nodes" +
                                      (MinNodes() < config_.nnodes
                                           ? " (at least " + std::to_string(MinNodes()) + " needed)"
                                           : std::string()) +
                                      " joined within " +
                                      Seconds(config_.rendezvous_timeout) +
                                      (evicted.empty() ? "" : "; gone: " + evicted) +
                                      (config_.spares > 0 ? "; no spare left" : ""));
      }
      break;
    default: break;
  }
}

JobView JobController::View() const {
  JobView view;
  view.now_mono = clock_->MonotonicNanos();
  view.now_wall = clock_->WallNanos();
  for (const auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) view.nodes.push_back(&n);
  }
  return view;
}

void JobController::CheckHeartbeats() {
  for (const Finding& f : DetectSilentNodes(View(), config_)) {
    if (state_ != JobState::kRunning && state_ != JobState::kStopping) return;
    Node* node = NodeById(f.node);
    if (node != nullptr && node->conn != 0 && node->group_rank >= 0) {
      NodeLost(node, f.description, f.fault_wall);
    }
  }
}

void JobController::Fail(const Finding& f) {
  if (state_ != JobState::kRunning) return;
  const std::string kind = FindingKindName(f.kind);
  const std::string& description = f.description;
  if (incident_) RecordDowntime(0);  // the previous restart never reached a step
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
  inc.lines = f.lines;
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
  Emit("failure", f.node, f.rank, inc.failure_step,
       "incident " + std::to_string(inc.number) + ": " + kind + ": " + description, d.dump(-1, ' ', false, kReplaceBadUtf8));

  SetState(JobState::kStopping, "stopping all ranks after " + kind);
  stop_sent_mono_ = clock_->MonotonicNanos();
  v1::ControllerMessage msg;
  msg.mutable_stop()->set_generation(generation_);
  msg.mutable_stop()->set_reason(kind + ": " + description);
  msg.mutable_stop()->set_grace_ms(static_cast<int>(config_.stop_grace / kMillisecond));
  for (int r : f.capture_stacks_of) msg.mutable_stop()->add_capture_stacks_of(r);
  for (auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) n.link->Send(msg);
  }
  MaybeAllStopped();
}

void JobController::MaybeAllStopped() {
  if (state_ != JobState::kStopping) return;
  for (const auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0 && n.stopped_generation != generation_) return;
  }
  Nanos now_wall = clock_->WallNanos();
  if (incident_) {
    incident_->stopped_wall = now_wall;
    Emit("stopped", "", -1, -1,
         "all ranks of generation " + std::to_string(generation_) + " stopped " +
             Seconds(now_wall - incident_->detected_wall) + " after detection",
         json{{"shutdown_ms", (now_wall - incident_->detected_wall) / kMillisecond}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  Verdict verdict = incident_ ? Decide() : Verdict{};
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

void JobController::Restart(const Verdict& verdict, bool diagnosed) {
  if (!diagnosed) {  // evictions first: an evicted node is not diagnosed
    // The reason names the incident: it goes with the cordon, and to the
    // scheduler (a Slurm drain reason), where an operator reads it.
    const std::string incident = "incident " + std::to_string(incident_ ? incident_->number : incident_count_);
    for (const auto& id : verdict.evict_nodes) Evict(id, incident + ": " + verdict.why, verdict.evidence_json);
    EvictCordonedNodes();
    if (config_.diagnose != "off") {
      pending_verdict_ = verdict;
      StartDiagnosis("incident " + std::to_string(incident_ ? incident_->number : incident_count_));
      return;
    }
  }
  ++restart_count_;
  waiting_since_mono_ = clock_->MonotonicNanos();
  SetState(JobState::kRestarting, "restart " + std::to_string(restart_count_));
  Emit("restarting", "", -1, -1,
       "restarting all ranks (restart " + std::to_string(restart_count_) + "/" +
           std::to_string(config_.max_restarts) + ")");
  MaybeStartGeneration();
}

std::string JobController::NodeOfRank(int rank) const {
  for (const auto& n : nodes_) {
    if (n.ranks.count(rank)) return n.node_id;
  }
  return "";
}

Verdict JobController::Decide() {
  const Incident& inc = *incident_;
  Blame b = AssignBlame(rules_, inc, [this](int rank) { return NodeOfRank(rank); });
  const FleetFinding fleet = ReadFleet(b);
  Verdict v = policy_.Decide(b, inc, fleet);
  const Attribution& a = b.attribution;
  const char* decision_name = DecisionName(v.decision);
  json evidence = json::array();
  for (const auto& e : a.evidence) {
    evidence.push_back({{"rank", e.rank}, {"node", e.node}, {"rule", e.rule_id},
                        {"category", e.category}, {"role", e.role}, {"line", e.line}});
  }
  std::vector<std::string> nodes(b.culprit_nodes.begin(), b.culprit_nodes.end());
  json d = {{"incident", inc.number},         {"failure_kind", inc.kind},
            {"category", a.category},         {"rule", a.rule_id},
            {"description", a.description},   {"hardware", a.hardware},
            {"persistence", a.persistence},   {"confidence", a.confidence},
            {"culprit_ranks", b.culprit_ranks}, {"culprit_nodes", nodes},
            {"recommended_action", a.action}, {"decision", decision_name},
            {"reason", v.why},                {"history", v.history},
            {"failure_step", b.step},         {"evidence", evidence},
            {"fleet", json::parse(fleet.EvidenceJson())},
            {"first_in_time", b.first_in_time}};
  Emit("attribution", b.culprit_node, b.culprit_rank, b.step,
       "incident " + std::to_string(inc.number) + ": " + a.category + " (" +
           (a.hardware ? "hardware" : "software") + ", " + a.persistence + ", confidence " +
           std::to_string(a.confidence).substr(0, 4) + "), culprit " + b.CulpritText(),
       d.dump(-1, ' ', false, kReplaceBadUtf8));
  Emit("decision", b.culprit_node, b.culprit_rank, b.step,
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
                           {"description", a.description}, {"evidence", evidence}}
                          .dump(-1, ' ', false, kReplaceBadUtf8);
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
  for (const auto& n : b.culprit_nodes) {
    auto health = HealthOf(n);
    if (health.ok() && health->status == "ok") q.node_since[n] = std::max(q.since, health->wall_ns);
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
    return {};
  }
  return ReadFleetHistory(b, *incidents, q);
}

void JobController::RecordDowntime(Nanos first_step_wall) {
  if (!incident_) return;
  DowntimeRecord r = DescribeDowntime(*incident_, first_step_wall);
  Emit("downtime", "", -1, incident_->failure_step, r.line, r.json);
  incident_.reset();
}

void JobController::Cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == JobState::kSucceeded || state_ == JobState::kFailed) return;
  Finish(JobState::kFailed, "job " + config_.job_id + " FAILED: cancelled: " + reason);
}

void JobController::Finish(JobState final_state, const std::string& summary) {
  if (incident_) RecordDowntime(0);
  summary_ = summary;
  SetState(final_state, summary);
  Nanos last_step_wall = 0;
  for (const auto& n : nodes_) {
    for (const auto& [r, view] : n.ranks) {
      last_step_wall = std::max<Nanos>(last_step_wall, view.status.last_step_unix_ms() * kMillisecond);
    }
  }
  Emit(final_state == JobState::kSucceeded ? "job_succeeded" : "job_failed", "", -1, MaxStep(),
       summary, json{{"restart_count", restart_count_}, {"last_step_unix_ms", last_step_wall / kMillisecond},
                     {"checkpoint_overhead_ms", CheckpointOverheadMs()}}.dump(-1, ' ', false, kReplaceBadUtf8));
  writer_->UpdateJob(config_.job_id, JobStateName(final_state), ValidUtf8(summary));
  v1::ControllerMessage msg;
  msg.mutable_shutdown()->set_reason(summary);
  msg.mutable_shutdown()->set_exit_status(final_state == JobState::kSucceeded ? 0 : last_failure_status_);
  for (auto& n : nodes_) {
    if (n.conn != 0) n.link->Send(msg);
  }
  finished_cv_.notify_all();
}

void JobController::SetState(JobState s, const std::string& why) {
  if (s == state_) return;
  JobState old = state_;
  state_ = s;
  Emit("state", "", -1, -1, std::string(JobStateName(old)) + " -> " + JobStateName(s) + ": " + why,
       json{{"from", JobStateName(old)}, {"to", JobStateName(s)}}.dump(-1, ' ', false, kReplaceBadUtf8));
  if (s != JobState::kSucceeded && s != JobState::kFailed) {
    writer_->UpdateJob(config_.job_id, JobStateName(s), "");
  }
}

StoreWriter::Ticket JobController::Emit(const std::string& kind, const std::string& node, int rank,
                         std::int64_t step, const std::string& message,
                         const std::string& detail_json) {
  Event e;
  e.job_id = config_.job_id;
  e.wall_ns = clock_->WallNanos();
  e.kind = kind;
  e.node = node;
  e.rank = rank;
  e.generation = generation_;
  e.step = step;
  // Messages quote command lines and rank output: the store keeps UTF-8 text.
  e.message = ValidUtf8(message);
  e.detail_json = detail_json;
  if (listener_ != nullptr) listener_->OnEvent(e);
  // In order, on the writer's thread; retried while the store is away (store_writer.h).
  return writer_->Append(std::move(e));
}

void JobController::SetEventListener(EventListener* listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = listener;
}

double JobController::CheckpointOverheadMs() const {
  // Ranks save at the same steps and block at the same time: the job lost
  // the longest of them, not their sum. Microseconds where the agent sends them.
  double m = 0;
  for (const auto& n : nodes_) {
    for (const auto& [rank, view] : n.ranks) {
      const v1::RankStatus& s = view.status;
      double ms = s.checkpoint_blocked_us() > 0 ? s.checkpoint_blocked_us() / 1000.0
                                                : static_cast<double>(s.checkpoint_blocked_ms());
      m = std::max(m, ms);
    }
  }
  return m;
}

std::int64_t JobController::MaxStep() const {
  std::int64_t m = -1;
  for (const auto& n : nodes_) {
    for (const auto& [rank, view] : n.ranks) m = std::max(m, view.status.step());
  }
  return m;
}

}  // namespace trainguard
