// JobController: the job's lifecycle (start, cancel, finish), the dispatch
// of agent messages to their handlers, state changes and the event record.
// The rest, by concern: job_controller_reports.cc (what agents report),
// _tick.cc (what time decides), _incident.cc (an incident to its decision),
// _generation.cc (starting and restarting), _nodes.cc (who holds which group
// rank), _register.cc, _diagnosis.cc, _timings.cc, _resume.cc, _snapshot.cc.
#include "controller/job_controller.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/json_text.h"
#include "common/utf8.h"
#include "controller/fleet_failure_rate.h"
#include "controller/job_knobs.h"
#include "controller/off_lock_runner.h"

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
      explain_(std::make_unique<OffLockRunner>(4)),
      blame_(std::make_unique<OffLockRunner>(1)),
      starter_(std::make_unique<OffLockRunner>(1)),
      policy_(config_.no_progress_restarts, config_.min_confidence),
      diagnosis_(config_),
      link_monitor_(LinkPolicy{config_.link_flap_window, config_.link_flaps_to_evict}),
      sdc_(config_.job_id, config_.nproc_per_node),
      telemetry_(config_, clock_, writer_.get()),
      checkpoints_(config_) {}

JobController::~JobController() {
  starter_.reset();  // its work takes mu_ and sends: bounded by start_record_wait
  explain_.reset();  // their work reads the members below: it ends first
  blame_.reset();
}  // then writer_ drains (bounded) and stops

bool JobController::FlushStore(std::chrono::milliseconds timeout) { return writer_->Flush(timeout); }

StatusOr<NodeHealth> JobController::HealthOf(const std::string& node_id) {
  if (auto pending = writer_->PendingHealth(node_id)) return *pending;
  if (auto read = health_.Get(node_id)) return *read;
  return Unavailable("the store's node health has not been read yet");
}

StatusOr<NodeHealth> JobController::StoredHealthOf(const std::string& node_id) {
  if (auto pending = writer_->PendingHealth(node_id)) return *pending;
  return store_->GetNodeHealth(node_id);
}

void JobController::ReadHealthOffLock() {
  if (health_reading_) return;
  health_reading_ = true;
  explain_->Run([this]() -> OffLockRunner::Apply {
    const Nanos at = clock_->MonotonicNanos();
    auto rows = store_->ListNodeHealth();
    if (!rows.ok()) {
      ++store_read_errors_;
      return [this] { health_reading_ = false; };
    }
    auto indexed = std::make_shared<NodeHealthCache::Rows>(NodeHealthCache::Index(std::move(rows.value())));
    return [this, indexed, at] {
      health_reading_ = false;
      health_.Replace(std::move(*indexed), at);
    };
  });
}

void JobController::ReadSdcHistoryOffLock(const std::vector<std::string>& nodes) {
  explain_->Run([this, nodes]() -> OffLockRunner::Apply {
    std::map<std::string, int> confirmed;
    for (const auto& n : nodes) {
      auto actions = store_->NodeActions(n);
      if (!actions.ok()) {
        ++store_read_errors_;
        continue;
      }
      for (const auto& a : *actions) confirmed[n] += a.action == "sdc-confirmed";
    }
    return [this, confirmed] {
      for (const auto& [n, count] : confirmed) health_.SetSdcConfirmed(n, count);
    };
  });
}

void JobController::SetNodeProvider(NodeProvider* provider) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    provider_ = provider;
  }
  explain_->WaitIdle();  // the old backend is asked nothing more
  std::lock_guard<std::mutex> lock(mu_);
  TakeOffLockResults();
  Reconcile();
}

void JobController::SetOffLockThreads(int threads) {
  explain_->WaitIdle();
  blame_->WaitIdle();
  starter_->WaitIdle();
  std::lock_guard<std::mutex> lock(mu_);
  TakeOffLockResults();
  explain_ = std::make_unique<OffLockRunner>(threads);
  blame_ = std::make_unique<OffLockRunner>(std::min(threads, 1));
  starter_ = std::make_unique<OffLockRunner>(std::min(threads, 1));
  off_lock_threads_ = threads;
  health_reading_ = false;  // what the old runners did is not taken
  Reconcile();  // on the new runners: work the loop starts now is not dropped with the old ones
}

Status JobController::Start() {
  // The store's part, off the lock (agents a listening server accepted
  // already wait on it): the job's row, and what the store says of nodes.
  std::string command;
  for (const auto& a : config_.argv) command += (command.empty() ? "" : " ") + a;
  // The checkpoint plan's prior: the fleet's own rate where the jobs that
  // ended in this store had enough failures to say one, unless given.
  std::string prior_from;
  JobConfig recorded = config_;  // as the knobs are recorded: with the prior the plan starts from
  if (!config_.failure_prior_given) {
    auto jobs = store_->Jobs();
    auto incidents = jobs.ok() ? store_->IncidentsOnNode("") : StatusOr<std::vector<IncidentRecord>>(jobs.status());
    if (incidents.ok()) {
      const FleetFailureRate fleet = ReadFleetFailureRate(*jobs, *incidents, config_.job_id);
      if (static_cast<double>(fleet.failures) >= std::max(config_.failure_prior_weight, 1.0)) {
        recorded.failure_prior_per_gpu_hour = fleet.PerGpuHour();
        prior_from = fleet.Describe();
      }
    } else {
      ++store_read_errors_;
    }
  }
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
              {"straggler_action", StragglerActionName(config_.straggler_action)},
              {"argv", config_.argv}};
  if (!config_.api_url.empty()) cfg["api_url"] = config_.api_url;
  cfg["knobs"] = json::parse(KnobsJson(recorded));  // every knob, from its table (job_knobs.h)
  if (!prior_from.empty()) cfg["failure_prior_from"] = prior_from;
  const Nanos health_read = clock_->MonotonicNanos();
  auto health = store_->ListNodeHealth();
  TG_RETURN_IF_ERROR(store_->CreateJob(
      {config_.job_id, clock_->WallNanos(), ValidUtf8(command), cfg.dump(-1, ' ', false, kReplaceBadUtf8), "STARTING", ""}));
  std::lock_guard<std::mutex> lock(mu_);
  if (!prior_from.empty()) checkpoints_.UseFleetPrior(recorded.failure_prior_per_gpu_hour, prior_from);
  if (health.ok()) {
    health_.Replace(NodeHealthCache::Index(std::move(health.value())), health_read);
  } else {
    ++store_read_errors_;  // read again at the next tick; until then no node is known cordoned
  }
  next_health_read_mono_ = health_read + config_.health_refresh;
  waiting_since_mono_ = clock_->MonotonicNanos();
  Emit(EventKind::kJobCreated, "", -1, -1,
       "job " + config_.job_id + ": " + std::to_string(config_.nnodes) + " node(s) x " +
           std::to_string(config_.nproc_per_node) + " rank(s): " + command,
       cfg.dump(-1, ' ', false, kReplaceBadUtf8));
  started_ = true;
  for (const auto& [conn, reg] : early_registrations_) HandleRegister(conn, reg);
  early_registrations_.clear();
  Reconcile();
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

namespace {

// Every message to the agent carries the controller's lead (its fencing
// token): an agent that follows a newer leader acts on none of it.
class EpochStampedLink final : public AgentLink {
 public:
  EpochStampedLink(std::shared_ptr<AgentLink> link, std::int64_t epoch) : link_(std::move(link)), epoch_(epoch) {}
  void Send(const v1::ControllerMessage& msg) override {
    v1::ControllerMessage stamped = msg;
    stamped.set_lead_epoch(epoch_);
    link_->Send(stamped);
  }
  void Close() override { link_->Close(); }
  Nanos LastHeardMono() const override { return link_->LastHeardMono(); }

 private:
  const std::shared_ptr<AgentLink> link_;
  const std::int64_t epoch_;
};

}  // namespace

void JobController::OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink> link) {
  if (config_.lead_epoch > 0) link = std::make_shared<EpochStampedLink>(std::move(link), config_.lead_epoch);
  std::lock_guard<std::mutex> lock(mu_);
  // The node is not known until it registers: its link waits for Register.
  pending_links_[conn] = std::move(link);
}

void JobController::OnMessage(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived_mono) {
  HandleMessage(conn, msg, nullptr, arrived_mono);
}

void JobController::OnMessage(std::uint64_t conn, v1::AgentMessage&& msg, Nanos arrived_mono) {
  HandleMessage(conn, msg, &msg, arrived_mono);
}

void JobController::HandleMessage(std::uint64_t conn, const v1::AgentMessage& msg, v1::AgentMessage* owned,
                                  Nanos arrived_mono) {
  if (IngestTelemetry(conn, msg, arrived_mono)) return;  // without the job's lock
  // A Tick waiting for the lock goes first: a burst of thousands of
  // messages (every node's Stopped) would otherwise take the mutex back
  // before the ticker wakes, and hold the detectors up for seconds.
  while (tick_waiting_.load(std::memory_order_acquire)) std::this_thread::yield();
  std::lock_guard<std::mutex> lock(mu_);
  const JobState was = state_;
  Dispatch(conn, msg, owned);
  // Heartbeats (thousands a second) move the loop only when they opened an
  // incident; what else an agent says may be the step the loop waits for.
  if (!msg.has_heartbeat() || state_ != was) Reconcile();
}

bool JobController::IngestTelemetry(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived_mono) {
  if (msg.has_clock_echo()) {
    telemetry_.OnClockEcho(conn, msg.clock_echo(), arrived_mono);
    return true;
  }
  if (!msg.has_timings()) return false;
  if (!telemetry_.OnTimings(conn, msg.timings())) return true;  // nothing found: the job's lock is not needed
  std::lock_guard<std::mutex> lock(mu_);
  const JobState was = state_;
  TakeTelemetry();
  if (state_ != was) Reconcile();
  return true;
}

void JobController::Dispatch(std::uint64_t conn, const v1::AgentMessage& msg, v1::AgentMessage* owned) {
  if (msg.has_register_()) {
    if (!started_) {
      early_registrations_.emplace_back(conn, msg.register_());
    } else {
      HandleRegister(conn, msg.register_());
    }
    return;
  }
  Node* node = nodes_.ByConn(conn);
  if (node == nullptr) return;  // not registered: ignore
  switch (msg.kind_case()) {
    case v1::AgentMessage::kHeartbeat:
      HandleHeartbeat(node, msg.heartbeat(), owned != nullptr ? owned->mutable_heartbeat() : nullptr);
      break;
    case v1::AgentMessage::kStarted:
      HandleStarted(node, msg.started(), owned != nullptr ? owned->mutable_started() : nullptr);
      break;
    case v1::AgentMessage::kRankExited: HandleRankExited(node, msg.rank_exited()); break;
    case v1::AgentMessage::kStopped: HandleStopped(node, msg.stopped()); break;
    case v1::AgentMessage::kLogAlert: HandleLogAlert(node, msg.log_alert()); break;
    case v1::AgentMessage::kDiagnostics: HandleDiagnostics(node, msg.diagnostics()); break;
    case v1::AgentMessage::kStandbyImports: HandleStandbyImports(node, msg.standby_imports()); break;
    default: break;
  }
}

void JobController::Cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == JobState::kSucceeded || state_ == JobState::kFailed) return;
  Finish(JobState::kFailed, "job " + config_.job_id + " FAILED: cancelled: " + reason);
}

void JobController::Finish(JobState final_state, const std::string& summary) {
  if (incident_) RecordDowntime(RestartPath{});
  summary_ = summary;
  SetState(final_state, summary);
  Nanos last_step_wall = 0;
  for (const auto& n : nodes_) {
    for (const auto& [r, view] : n.ranks) {
      last_step_wall = std::max<Nanos>(last_step_wall, view.status.last_step_unix_ms() * kMillisecond);
    }
  }
  Emit(final_state == JobState::kSucceeded ? EventKind::kJobSucceeded : EventKind::kJobFailed, "", -1, MaxStep(),
       summary, json{{"restart_count", restart_count_}, {"last_step_unix_ms", last_step_wall / kMillisecond},
                     {"checkpoint_overhead_ms", CheckpointOverheadMs()},
                     {"checkpoint_wait_ms", CheckpointWaitMs()},
                     {"data_wait_ms", telemetry_.DataWaitMs()},
                     {"checkpoint_saves", checkpoints_.saves()}}.dump(-1, ' ', false, kReplaceBadUtf8));
  writer_->UpdateJob(config_.job_id, JobStateName(final_state), ValidUtf8(summary), clock_->WallNanos());
  v1::ControllerMessage msg;
  msg.mutable_shutdown()->set_reason(summary);
  msg.mutable_shutdown()->set_exit_status(final_state == JobState::kSucceeded ? 0 : last_failure_status_);
  for (auto& n : nodes_) {
    if (n.conn != 0) n.link->Send(msg);
  }
  for (auto& [conn, link] : pending_links_) link->Send(msg);  // connected, never registered
  finished_cv_.notify_all();
}

void JobController::SetState(JobState s, const std::string& why) {
  if (s == state_) return;
  JobState old = state_;
  state_ = s;
  next_wait_scan_mono_ = 0;  // a state that waits for nodes looks at them at once
  telemetry_.SetRunning(s == JobState::kRunning);
  Emit(EventKind::kState, "", -1, -1, std::string(JobStateName(old)) + " -> " + JobStateName(s) + ": " + why,
       json{{"from", JobStateName(old)}, {"to", JobStateName(s)}}.dump(-1, ' ', false, kReplaceBadUtf8));
  if (s != JobState::kSucceeded && s != JobState::kFailed) {
    writer_->UpdateJob(config_.job_id, JobStateName(s), "");
  }
}

StoreWriter::Ticket JobController::Emit(EventKind kind, const std::string& node, int rank,
                         std::int64_t step, const std::string& message,
                         const std::string& detail_json) {
  Event e;
  e.job_id = config_.job_id;
  e.wall_ns = clock_->WallNanos();
  e.kind = EventKindName(kind);
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

double JobController::CheckpointWaitMs() const {
  double m = 0;
  for (const auto& n : nodes_) {
    for (const auto& [rank, view] : n.ranks) m = std::max(m, view.status.checkpoint_waited_us() / 1000.0);
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
