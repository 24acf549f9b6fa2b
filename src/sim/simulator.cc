#include "sim/simulator.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "controller/checkpoint_planner.h"
#include "sim/simulation.h"

namespace trainguard {

using nlohmann::json;

namespace sim_detail {
namespace {

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// This thread's: the simulation and the controller, without the store's writer thread.
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

}  // namespace

void Simulation::Handle(const SimEvent& e) {
  const Nanos now = clock_.MonotonicNanos();
  switch (e.kind) {
    case Ev::kFault: {
      if (ending_) break;
      double u = Uniform() * model_.PerNodeDay(), acc = 0;
      int cat = static_cast<int>(model_.categories.size()) - 1;
      for (size_t c = 0; c < model_.categories.size(); ++c) {
        acc += model_.categories[c].per_node_day;
        if (u < acc) {
          cat = static_cast<int>(c);
          break;
        }
      }
      Inject(cat);
      ScheduleNextFault();
      break;
    }
    case Ev::kStarted: {
      Node& n = nodes_[e.node];
      if (!n.alive || !n.in_session || n.generation != e.a) break;
      auto* s = started_.mutable_started();
      s->Clear();
      s->set_generation(e.a);
      FillRanks(e.node, now, s->mutable_ranks(), true);
      s->set_started_unix_ms(Wall(now) / kMillisecond);
      Deliver(e.node, std::move(started_));
      break;
    }
    case Ev::kFirstStep:
      // One report makes the first step known (the controller's first_step
      // and the restart's downtime); the others' statuses from their start
      // stand until the first round: before its first step a rank's hang
      // timeout is the startup timeout, longer than a round.
      if (e.a != gen_.g || gen_.frozen <= now) break;
      fault_outstanding_ = false;
      if (!slot_node_.empty() && slot_node_[0] >= 0) Report(slot_node_[0]);
      Schedule(now + std::min(round_, first_round_), Ev::kRound, -1, e.a);
      // Nodes still slow set the new generation's pace.
      Repace(now);
      if (SlowVisible()) Watch(now);
      break;
    case Ev::kRound:
      if (e.a != gen_.g || gen_.frozen <= now) break;
      ReportAll();
      Schedule(now + round_, Ev::kRound, -1, e.a);
      break;
    case Ev::kHangReport:
      if (e.a != gen_.g) break;
      ReportAll();
      break;
    case Ev::kCheckpoint:
      if (e.a != gen_.g || e.node != gen_.save_token || gen_.frozen <= now) break;
      Save(now);
      if (!slot_node_.empty() && slot_node_[0] >= 0) Report(slot_node_[0]);
      break;
    case Ev::kPeerCopied:
      SavedToPeer(now, e.a);
      break;
    case Ev::kPersisted:
      SavedToStorage(now, e.node, e.a);
      // Without a memory tier, storage is what a restart resumes from: the controller hears of it.
      if (!MemoryTier() && !slot_node_.empty() && slot_node_[0] >= 0) Report(slot_node_[0]);
      break;
    case Ev::kStopped: {
      Node& n = nodes_[e.node];
      if (!n.alive || !n.in_session) break;
      n.ranks_running = false;
      scratch_.Clear();
      auto* s = scratch_.mutable_stopped();
      s->set_generation(e.a);
      s->set_free_port(29500);
      s->set_stopped_unix_ms(Wall(now) / kMillisecond);
      // As a real agent does, the node's recent kernel log goes with it:
      // a GPU that hung its rank left its Xid there.
      if (n.struck >= 0) {
        for (const auto& l : model_.categories[n.struck].kernel_lines) s->add_kernel_lines(l);
        n.struck = -1;
      }
      Deliver(e.node, std::move(scratch_));
      break;
    }
    case Ev::kDiagnosed: {
      Node& n = nodes_[e.node];
      if (!n.alive || !n.in_session) break;
      scratch_.Clear();
      auto* d = scratch_.mutable_diagnostics();
      d->set_round(e.a / 2);
      d->set_collective(e.a % 2 == 1);
      // A node with a persistent hardware fault fails its compute check.
      bool sick = n.broken >= 0 && model_.categories[n.broken].hardware;
      d->set_figures_json(json::array({{{"name", "compute_gflops"}, {"value", sick ? 40.0 : 1000.0}}}).dump());
      d->set_wall_ms(static_cast<std::int64_t>(p_.diagnose_s * 1000));
      d->set_free_port(29501);
      Deliver(e.node, std::move(scratch_));
      break;
    }
    case Ev::kSdcNan: {
      // Wherever the job is now, its state is corrupt: the next step's loss is NaN.
      if (sdc_since_ < 0) break;
      Node& n = nodes_[e.node];
      int node = e.node;
      if (!(n.alive && n.ranks_running && n.generation == gen_.g) && !slot_node_.empty()) node = slot_node_[0];
      if (node < 0 || !nodes_[node].ranks_running || gen_.frozen != kNever || gen_.first > now) {
        Schedule(std::max(now, gen_.first) + Sec(1), Ev::kSdcNan, e.node, e.a);
        break;
      }
      result_.sdc_redone_s += ToSec(now - sdc_since_);
      if (!gen_cause_.count(gen_.g)) gen_cause_[gen_.g] = static_cast<int>(e.a);
      fault_outstanding_ = true;
      Freeze(now);
      Crash(node, static_cast<int>(e.a));
      break;
    }
    case Ev::kSdcShows: {
      // The diverged rank's fingerprint is taken: every node's next
      // heartbeat carries its ranks' (the replica check needs them all).
      if (e.a != gen_.g || gen_.frozen <= now || sdc_rank_ < 0) break;
      const std::int64_t k = p_.fingerprint_every;
      if (StepAt(now) / k * k < sdc_step_) {  // a save held the steps up
        Schedule(now + Sec(p_.step_s), Ev::kSdcShows, -1, e.a);
        break;
      }
      if (!gen_cause_.count(gen_.g)) gen_cause_[gen_.g] = sdc_category_;
      fault_outstanding_ = true;
      ReportAll();
      break;
    }
    case Ev::kRefault: {
      Node& n = nodes_[e.node];
      if (n.broken < 0 || n.generation != e.a || !n.alive) break;
      ++result_.categories[n.broken].injected;
      Strike(e.node, n.broken, n.broken_signal);
      break;
    }
    case Ev::kPlannedDown: {
      Node& n = nodes_[e.node];
      if (!n.alive) break;
      n.planned = true;
      Strike(e.node, static_cast<int>(e.a), FailureSignal::kNodeDown);
      break;
    }
    case Ev::kArrive: {
      int i = AddNode();
      Connect(i);
      break;
    }
    case Ev::kRepaired:
      ++pool_left_;
      break;
    case Ev::kDisconnect: {
      Node& n = nodes_[e.node];
      if (n.alive || !n.in_session) break;  // the controller closed it first
      n.in_session = false;
      SetHeard(e.node);
      ctl_->OnDisconnect(static_cast<std::uint64_t>(e.node) + 1);
      break;
    }
    case Ev::kSlow:
      if (ending_) break;
      Slow();
      ScheduleNextSlow();
      break;
    case Ev::kPreWatch:
      if (!ending_) PreWatch();
      break;
    case Ev::kSlowEnd:
      SlowEnds(e.node, e.a);
      break;
    case Ev::kTimings:
      TimingsDue(e.a);
      break;
    case Ev::kEnd:
      EndJob();
      break;
  }
}

void Simulation::EndJob() {
  const Nanos now = clock_.MonotonicNanos();
  if (ctl_->finished()) return;
  bool stepping = ctl_->state() == JobState::kRunning && gen_.first <= now && gen_.frozen == kNever;
  for (int node : slot_node_) {
    // A node that died and is not yet found lost: the job is not whole.
    if (node >= 0 && (!nodes_[node].alive || !nodes_[node].ranks_running)) stepping = false;
  }
  if (!stepping) {
    // Mid-recovery: the job ends at its next first step (at most a day on).
    if (now - end_mono_ < 86400 * kSecond) {
      Schedule(now + kSecond, Ev::kEnd);
    } else {
      ctl_->Cancel("the simulation's time is up and the job has not run again for a day");
    }
    return;
  }
  ending_ = true;
  CountSlowed(now);
  ReportAll();
  for (int node : slot_node_) {
    if (node < 0 || !nodes_[node].alive || !nodes_[node].ranks_running) continue;
    google::protobuf::RepeatedPtrField<v1::RankStatus> ranks;
    FillRanks(node, now, &ranks, false);
    for (auto& r : ranks) {
      scratch_.Clear();
      auto* ex = scratch_.mutable_rank_exited();
      ex->set_generation(gen_.g);
      *ex->mutable_rank() = r;
      ex->mutable_rank()->set_running(false);
      ex->mutable_rank()->set_exit_code(0);
      ex->set_exit_unix_ms(Wall(now) / kMillisecond);
      Deliver(node, std::move(scratch_));
    }
    nodes_[node].ranks_running = false;
  }
}

StatusOr<SimResult> Simulation::Run() {
  if (std::filesystem::exists(opt_.store_path)) {
    return FailedPrecondition("the simulation's store " + opt_.store_path + " exists already");
  }
  auto store = OpenSqliteEventStore(opt_.store_path);
  if (!store.ok()) return store.status();
  store_ = std::move(store.value());
  auto ws = OpenSqliteEventStore(opt_.store_path);
  if (!ws.ok()) return ws.status();
  write_store_ = std::move(ws.value());

  JobConfig c = SimJobConfig(p_);
  // The checkpoint plan's prior: the failure model's rate, and the share of
  // failures that lose a node and its peer or roll back past corruption.
  c.failure_prior_per_gpu_hour = model_.PerNodeDay() / 24 / p_.gpus_per_node;
  double storage_rate = 0;
  for (const auto& cat : model_.categories) {
    for (const auto& [signal, weight] : cat.signals) {
      if (signal == FailureSignal::kNodeDown) storage_rate += cat.per_node_day * weight * p_.peer_loss_fraction;
      if (signal == FailureSignal::kSdc) storage_rate += cat.per_node_day * weight;
    }
  }
  c.storage_loss_prior_share = model_.PerNodeDay() > 0 ? storage_rate / model_.PerNodeDay() : 0;
  // The first round comes before any rank's startup timeout runs out.
  first_round_ = std::max(kSecond, c.startup_timeout - Sec(p_.LaunchS(nnodes_)) - 10 * kSecond);
  ctl_ = std::make_unique<JobController>(c, &clock_, store_.get(), &provider_, opt_.rules, write_store_.get());
  ctl_->SetOffLockThreads(0);
  ctl_->SetEventListener(&recorded_);
  TG_RETURN_IF_ERROR(ctl_->Start());
  pool_left_ = p_.pool;

  const auto real0 = std::chrono::steady_clock::now();
  const double cpu0 = CpuSeconds();
  const double thread0 = ThreadCpuSeconds();
  start_mono_ = clock_.MonotonicNanos();
  end_mono_ = start_mono_ + Sec(p_.days * 86400);
  for (int i = 0; i < nnodes_ + p_.spares; ++i) Connect(AddNode());
  ScheduleNextFault();
  ScheduleNextSlow();
  Schedule(end_mono_, Ev::kEnd);

  Nanos next_tick = clock_.MonotonicNanos();
  Nanos last_progress = start_mono_;
  JobState state = ctl_->state();
  while (!ctl_->finished()) {
    if (clock_.MonotonicNanos() > end_mono_ + 2 * 86400 * kSecond) {
      // EndJob gives a job in recovery a day; nothing may run on past that.
      ctl_->Cancel("the simulation ran two days past its end");
      break;
    }
    Nanos next_event = queue_.empty() ? kNever : queue_.top().at;
    if (next_tick <= next_event) {
      Nanos dt = next_tick - clock_.MonotonicNanos();
      result_.state_s[JobStateName(state)] += ToSec(dt);
      clock_.Advance(dt);
      ctl_->Tick();
      state = ctl_->state();
      bool fine = fault_outstanding_ || state != JobState::kRunning;
      next_tick += fine ? 50 * kMillisecond : kSecond;
      if (opt_.progress && clock_.MonotonicNanos() - last_progress >= 86400 * kSecond) {
        last_progress = clock_.MonotonicNanos();
        opt_.progress("day " + std::to_string((last_progress - start_mono_) / (86400 * kSecond)) + ": " +
                      std::to_string(ctl_->restart_count()) + " restarts, " + JobStateName(state));
      }
      continue;
    }
    if (next_event == kNever) break;
    SimEvent e = queue_.top();
    queue_.pop();
    result_.state_s[JobStateName(state)] += ToSec(e.at - clock_.MonotonicNanos());
    clock_.Advance(e.at - clock_.MonotonicNanos());
    Handle(e);
    state = ctl_->state();
  }
  result_.sim_s = ToSec(clock_.MonotonicNanos() - start_mono_);
  result_.summary = ctl_->summary();
  if (!ctl_->FlushStore(std::chrono::minutes(10))) return Internal("the store did not take the simulation's events");
  result_.real_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - real0).count();
  result_.cpu_s = CpuSeconds() - cpu0;
  result_.sim_cpu_s = ThreadCpuSeconds() - thread0;
  Tally();
  if (ctl_->state() != JobState::kSucceeded) {
    result_.finished = false;
    result_.why_not = "the job " + std::string(JobStateName(ctl_->state())) + " after " +
                      std::to_string(ToSec(clock_.MonotonicNanos() - start_mono_) / 86400).substr(0, 5) +
                      " simulated days: " + result_.summary;
    if (p_.spares == 0 && p_.replacement_s < 0) {
      result_.why_not += ". With no spare and no replacement (replacement_s < 0), the place of a lost or evicted node "
                         "stays empty, and the job cannot run on fewer nodes";
    } else if (p_.pool >= 0 && pool_left_ <= 0) {
      result_.why_not += ". The scheduler's pool of " + std::to_string(p_.pool) + " replacement nodes ran out";
    }
  }
  return result_;
}

void Simulation::Tally() {
  // The report's own accounting, over the events as the controller recorded
  // them (the same events the store holds: FlushStore has written them).
  result_.events_stored = recorded_.recorded;
  auto report = ComputeReport("sim", recorded_.kept);
  if (!report.ok()) return;
  result_.report = report.value();
  for (const auto& inc : result_.report.incidents) {
    std::int64_t g = inc.value("generation", -1LL);
    int category = -1;
    if (auto cause = gen_cause_.find(g); cause != gen_cause_.end()) {
      category = cause->second;
    } else {
      // A node that died while the job was restarting is found lost in the
      // next generation: its fault is the cause.
      for (const auto& id : inc.value("culprit_nodes", json::array())) {
        auto it = node_by_id_.find(id.get<std::string>());
        if (it != node_by_id_.end() && nodes_[it->second].down_category >= 0) category = nodes_[it->second].down_category;
      }
    }
    if (category < 0 && straggler_category_ >= 0 && inc.value("failure_kind", std::string()) == "straggler") {
      // Nothing failed: the controller evicted a straggler (--straggler-action
      // evict). Its cause if the node it named was slowed (in the job, or
      // before it joined: a spare, a node between generations); else it
      // evicted a healthy node.
      for (const auto& id : inc.value("culprit_nodes", json::array())) {
        for (const SimSlowdown& s : result_.slowdown_list) {
          if (s.node == id.get<std::string>()) category = straggler_category_;
        }
      }
    }
    if (category < 0) {
      ++result_.false_alarms;
      if (opt_.progress) opt_.progress("an incident with no fault behind it: " + inc.dump());
      continue;
    }
    SimCategoryStats& s = result_.categories[category];
    ++s.incidents;
    s.detection_s += inc.value("detection_s", 0.0);
    s.lost_s += inc.value("lost_s", 0.0);
    s.shutdown_s += inc.value("shutdown_s", 0.0);
    s.restart_s += inc.value("restart_s", 0.0);
    if (inc.value("decision", std::string()) == "evict_node") ++s.evictions;
    if (inc.contains("hardware") && inc["hardware"].get<bool>() == s.hardware) ++s.hardware_agrees;
  }
  double wall = result_.report.wall_s;
  result_.ettr_true = wall > 0 ? result_.report.ettr - (result_.sdc_redone_s + result_.slowed_s) / wall : 0;
  TallyStragglers();
  result_.memory_interval_s = memory_every_s_;
  result_.storage_interval_s = storage_every_s_;
  result_.storage_restores = storage_restores_;
  const DowntimeReport& d = result_.report;
  const auto n = static_cast<double>(d.incidents.size());
  if (n > 0 && wall > 0) {
    result_.mtbf_s = wall / n;
    const double per_failure = (d.detection_s + d.shutdown_s + d.restart_s) / n;
    const double cost = p_.checkpoint_blocked_s;
    result_.optimum_interval_s = std::max(OptimalCheckpointInterval(cost, result_.mtbf_s), p_.step_s);
    result_.optimum_ettr = 1 - per_failure / result_.mtbf_s -
                           CheckpointOverhead(result_.optimum_interval_s, cost, result_.mtbf_s, 0);
    const double every = MemoryTier() ? memory_every_s_ : storage_every_s_;
    result_.model_ettr = 1 - per_failure / result_.mtbf_s - CheckpointOverhead(every, cost, result_.mtbf_s, 0);
  }
}


}  // namespace sim_detail

using sim_detail::Sec;
using sim_detail::Simulation;

JobConfig SimJobConfig(const SimParams& p) {
  JobConfig c;
  c.job_id = "sim";
  c.nnodes = p.gpus / p.gpus_per_node;
  c.nproc_per_node = p.gpus_per_node;
  c.argv = {"python3", "train.py"};
  c.max_restarts = p.max_restarts < 0 ? std::numeric_limits<int>::max() : p.max_restarts;
  c.spares = p.spares;
  c.heartbeat_interval = Sec(p.heartbeat_interval_s);
  c.missed_heartbeats = p.missed_heartbeats;
  c.hang_timeout = Sec(p.hang_timeout_s);
  c.straggler_action = p.straggler_action == "evict" ? StragglerAction::kEvict : StragglerAction::kReport;
  c.startup_timeout = std::max(c.startup_timeout, Sec(p.LaunchS(c.nnodes) * 2 + 60));
  // SimParams checked it is one of the three.
  c.diagnose = p.diagnose == "full" ? DiagnoseMode::kFull : p.diagnose == "quick" ? DiagnoseMode::kQuick : DiagnoseMode::kOff;
  c.diag_timeout = std::max(c.diag_timeout, Sec(p.diagnose_s * 3));
  c.rendezvous_timeout = Sec(p.rendezvous_timeout_s > 0 ? p.rendezvous_timeout_s
                                                         : std::max(300.0, 2 * std::max(0.0, p.replacement_s)));
  c.no_progress_restarts = p.no_progress_restarts;
  // The nodes share the simulated clock: no offset to learn.
  c.clock_probe_interval = 3600 * kSecond;
  c.watch_gap_grace = 0;  // the simulated clock leaps
  // No operator cordons a simulated node: the store's node health is read
  // once an hour, not every 5 s (12,500 rows each time at 100,000 GPUs).
  c.health_refresh = 3600 * kSecond;
  // The checkpoint plan's costs: a save's blocking (until one is measured), and
  // how fast each tier writes; a memory tier unless fixed saves all go to storage.
  c.checkpoint_cost_prior_s = p.checkpoint_blocked_s;
  c.memory_tier_min_interval_s = std::max(p.peer_copy_s, p.step_s);
  c.storage_tier_min_interval_s = std::max(p.persist_s, p.step_s);
  c.memory_checkpoints = p.checkpoint_policy == "auto" || p.memory_interval_s > 0 ? 1 : 0;
  return c;
}

StatusOr<SimResult> RunSimulation(const SimParams& params, const FailureModel& model, const SimOptions& options) {
  SimParams p = params;
  if (p.gpus_per_node == 0) p.gpus_per_node = model.gpus_per_node;
  TG_RETURN_IF_ERROR(p.Validate());
  Simulation sim(p, model, options);
  return sim.Run();
}

}  // namespace trainguard
