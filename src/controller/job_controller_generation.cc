// JobController: starting a generation (its nodes, its Start, recorded
// before it is sent) and restarting after an incident (evictions, the
// diagnosis round, the restart count).
#include "controller/job_controller.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/utf8.h"
#include "controller/describe.h"
#include "controller/off_lock_runner.h"

namespace trainguard {

using nlohmann::json;

void JobController::MaybeStartGeneration() {
  if (state_ != JobState::kStarting && state_ != JobState::kRestarting) return;
  // Fewer nodes than the job's minimum ever registered: nothing can start
  // yet (a scan per registration made 12,500 nodes joining quadratic).
  if (static_cast<int>(nodes_.size()) < MinNodes()) return;
  const Nanos now = clock_->MonotonicNanos();
  if (reconcile_from_tick_ && now < next_wait_scan_mono_) return;  // Tick: at most once a second
  next_wait_scan_mono_ = now + kSecond;
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
  if (rediagnose_) {  // the round a predecessor died in (Resume), then the restart it held up
    rediagnose_ = false;
    if (config_.diagnose != DiagnoseMode::kOff) {
      pending_verdict_ = Verdict{};  // its evictions were made
      StartDiagnosis(DiagnosisPurpose::kIncident);
      return;
    }
    Restart(Verdict{}, /*diagnosed=*/true);  // counted and recorded; this generation follows
  }
  if (state_ == JobState::kStarting && config_.diagnose != DiagnoseMode::kOff && !preflight_done_) {
    StartDiagnosis(DiagnosisPurpose::kPreflight);
    return;
  }
  if (!empty.empty()) RenumberGroupRanks(&slots);
  const int previous_nnodes = active_nnodes_;
  active_nnodes_ = static_cast<int>(slots.size());
  if (previous_nnodes > 0 && active_nnodes_ != previous_nnodes) {
    Emit(EventKind::kWorldResized, "", -1, -1,
         "the job goes on with " + std::to_string(active_nnodes_) + " of " + std::to_string(config_.nnodes) +
             " nodes (was " + std::to_string(previous_nnodes) + "): world size " +
             std::to_string(active_nnodes_ * config_.nproc_per_node),
         json{{"nnodes", active_nnodes_}, {"previous_nnodes", previous_nnodes}, {"max_nnodes", config_.nnodes},
              {"min_nnodes", MinNodes()}, {"world_size", active_nnodes_ * config_.nproc_per_node}}
             .dump(-1, ' ', false, kReplaceBadUtf8));
  }
  generation_ = restart_count_;
  first_step_seen_ = false;
  first_step_wall_ = 0;
  first_step_no_ = -1;
  telemetry_.StartGeneration(generation_, active_nnodes_ * config_.nproc_per_node);
  sdc_.StartGeneration(generation_, active_nnodes_ * config_.nproc_per_node);
  generation_start_wall_ = clock_->WallNanos();
  const Node* master = slots[0];
  v1::ControllerMessage msg;
  v1::Start* start = msg.mutable_start();
  FillStart(start);
  start->set_master_addr(master->address);
  start->set_master_port(master->free_port);
  json group_ranks = json::object();
  for (Node* n : slots) group_ranks[n->node_id] = n->group_rank;
  json d = {{"master_addr", master->address}, {"master_port", master->free_port},
            {"restart_count", restart_count_}, {"nnodes", active_nnodes_}, {"group_ranks", group_ranks}};
  // The decision is in the store before it is acted on: a controller killed
  // after this point resumes this generation, not the one before it. One
  // that resumes it before its Starts went out starts it now without
  // recording it twice (its job_resumed says so).
  StoreWriter::Ticket decided;
  if (generation_recorded_) {
    generation_recorded_ = false;
  } else {
    decided = Emit(EventKind::kGenerationStarted, "", -1, -1,
                   "started generation " + std::to_string(generation_) + " (restart " +
                       std::to_string(restart_count_) + "/" + std::to_string(config_.max_restarts) + "), master " +
                       master->address + ":" + std::to_string(master->free_port),
                   d.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  exited_ok_ranks_ = 0;
  // What nodes outside the new generation last reported is not of it: a node
  // evicted generations ago must not lend its step to MaxStep (the failure
  // step, the lost work, the restart-storm guard: trainguard sim caught an
  // evicted node's old step standing as every later failure's).
  for (auto& n : nodes_) n.ranks.clear();
  std::vector<std::string> holders(slots.size());
  Starts starts;
  for (Node* n : slots) {
    start->set_group_rank(n->group_rank);
    AssignMemoryPeers(slots, start, *n);
    holders[n->group_rank] = slots[(n->group_rank + 1) % slots.size()]->node_id;
    n->stopped_generation = -1;
    n->last_heartbeat_mono = clock_->MonotonicNanos();
    starts.emplace_back(n->link, msg);
  }
  memory_holders_ = slots.size() > 1 ? holders : std::vector<std::string>{};
  SetState(JobState::kRunning, "generation " + std::to_string(generation_) + " started");
  SendWhenRecorded(decided, std::move(starts));
}

void JobController::SendWhenRecorded(StoreWriter::Ticket decided, Starts starts) {
  const std::int64_t generation = generation_;
  auto warn = [generation] {
    std::fprintf(stderr, "trainguard: generation %lld starts before the store has its record (the store is slow or "
                         "away; the record follows)\n", static_cast<long long>(generation));
  };
  if (off_lock_threads_ == 0) {  // inline (unit tests): waited for here, under the lock
    if (!writer_->WaitDurable(decided, std::chrono::milliseconds(config_.start_record_wait / kMillisecond))) warn();
    for (auto& [link, msg] : starts) link->Send(msg);
    return;
  }
  // Off the lock: messages, Tick and the API go on while the record is
  // written. The Start goes only if nothing stopped the generation
  // meanwhile: a Stop sent before it is answered (Stopped, no ranks) and
  // the generation is over.
  starter_->Run([this, decided, generation, warn, starts = std::move(starts)]() -> OffLockRunner::Apply {
    const bool recorded = writer_->WaitDurable(decided, std::chrono::milliseconds(config_.start_record_wait / kMillisecond));
    std::lock_guard<std::mutex> lock(mu_);
    if (generation_ != generation || state_ != JobState::kRunning) return nullptr;
    if (!recorded) warn();
    for (const auto& [link, msg] : starts) link->Send(msg);
    return nullptr;
  });
}

void JobController::GiveUpWaiting() {
  int present = 0;
  for (const auto& n : nodes_) present += (n.conn != 0 && n.group_rank >= 0) ? 1 : 0;
  std::string evicted;
  for (const auto& n : nodes_) {
    if (n.conn == 0 && n.group_rank < 0) evicted += (evicted.empty() ? "" : ", ") + n.node_id;
  }
  Finish(JobState::kFailed,
         "job " + config_.job_id + " FAILED: only " + std::to_string(present) + " of " +
             std::to_string(config_.nnodes) + " nodes" +
             (MinNodes() < config_.nnodes ? " (at least " + std::to_string(MinNodes()) + " needed)" : std::string()) +
             " joined within " + Seconds(config_.rendezvous_timeout) + (evicted.empty() ? "" : "; gone: " + evicted) +
             (config_.spares > 0 ? "; no spare left" : ""));
}

void JobController::AssignMemoryPeers(const std::vector<Node*>& slots, v1::Start* start, const Node& node) {
  start->clear_memory_peer();
  start->clear_memory_restore_from();
  start->clear_memory_restore_node();
  if (config_.memory_checkpoints <= 0 || config_.no_instrument || slots.size() < 2) return;
  // Each node's copies go to the next node in group-rank order: a node and
  // the one holding its copies are lost together only if both are.
  const Node* next = slots[(node.group_rank + 1) % slots.size()];
  if (next->memory_port > 0) start->set_memory_peer(next->address + ":" + std::to_string(next->memory_port));
  if (memory_holders_.size() != slots.size()) return;  // a resize renumbered the ranks
  const Node* holder = nodes_.ById(memory_holders_[node.group_rank]);
  if (holder == nullptr || holder->conn == 0 || holder->memory_port <= 0 || holder == &node) return;
  start->set_memory_restore_from(holder->address + ":" + std::to_string(holder->memory_port));
  start->set_memory_restore_node(holder->node_id);
}

void JobController::FillStart(v1::Start* start) const {
  start->set_generation(generation_);
  start->set_run_id(config_.job_id);
  start->set_nnodes(active_nnodes_);
  start->set_nproc_per_node(config_.nproc_per_node);
  start->set_world_size(active_nnodes_ * config_.nproc_per_node);
  start->set_max_restarts(config_.max_restarts);
  start->set_no_instrument(config_.no_instrument);
  start->set_warm(!config_.no_warm);
  start->set_memory_checkpoints(config_.memory_checkpoints);
  for (const auto& a : config_.argv) start->add_argv(a);
  for (const auto& [k, v] : config_.env) (*start->mutable_env())[k] = v;
  sdc_.FillStart(start);  // a rollback's bound, a replay's fingerprint step
}

void JobController::HandleStandbyImports(Node* node, const v1::StandbyImports& imports) {
  if (imports.generation() != generation_ || config_.no_warm || imports.modules_size() == 0) return;
  spare_standby_.Clear();
  v1::ControllerMessage msg;
  v1::PrepareStandby* order = msg.mutable_prepare_standby();
  FillStart(order->mutable_start());
  order->mutable_start()->set_group_rank(-1);
  *order->mutable_modules() = imports.modules();
  spare_standby_ = msg;
  for (auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank < 0 && !n.node_id.empty()) n.link->Send(spare_standby_);
  }
  (void)node;
}

void JobController::Restart(const Verdict& verdict, bool diagnosed) {
  if (!diagnosed) {  // evictions first: an evicted node is not diagnosed
    // The reason names the incident: it goes with the cordon, and to the
    // scheduler (a Slurm drain reason), where an operator reads it.
    const std::string incident = "incident " + std::to_string(incident_ ? incident_->number : incident_count_);
    for (const auto& id : verdict.evict_nodes) Evict(id, incident + ": " + verdict.why, verdict.evidence_json);
    EvictCordonedNodes();
    if (config_.diagnose != DiagnoseMode::kOff) {
      pending_verdict_ = verdict;
      StartDiagnosis(DiagnosisPurpose::kIncident);
      return;
    }
    // Suspects of a verdict read from log lines alone: the quick suite on
    // them (a node that fails it is evicted), even where the job diagnoses
    // nothing routinely.
    std::vector<std::string> suspects;
    for (const auto& id : verdict.diagnose_nodes) {
      const Node* n = nodes_.ById(id);
      if (n != nullptr && n->conn != 0 && n->runs_diagnostics) suspects.push_back(id);
    }
    if (!suspects.empty()) {
      pending_verdict_ = verdict;
      StartDiagnosis(DiagnosisPurpose::kIncident, suspects);
      return;
    }
  }
  ++restart_count_;
  waiting_since_mono_ = clock_->MonotonicNanos();
  SetState(JobState::kRestarting, "restart " + std::to_string(restart_count_));
  Emit(EventKind::kRestarting, "", -1, -1,
       "restarting all ranks (restart " + std::to_string(restart_count_) + "/" +
           std::to_string(config_.max_restarts) + ")");
}

}  // namespace trainguard
