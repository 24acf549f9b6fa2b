#include "sim/simulator.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <queue>
#include <random>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "controller/job_controller.h"
#include "store/event_store.h"

namespace trainguard {

using nlohmann::json;

namespace {

constexpr Nanos kNever = std::numeric_limits<Nanos>::max();
Nanos Sec(double s) { return static_cast<Nanos>(std::llround(s * 1e9)); }
double ToSec(Nanos n) { return static_cast<double>(n) / 1e9; }

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// What happens next, in simulated time. Ties go in the order scheduled.
enum class Ev : std::uint8_t {
  kFault,       // the next failure is drawn
  kStarted,     // node: its ranks were spawned (RanksStarted)
  kFirstStep,   // the generation made its first step: every node reports
  kRound,       // every node of the generation reports (a heartbeat each)
  kCheckpoint,  // a checkpoint committed: rank 0's node reports it
  kStopped,     // node: its ranks stopped (Stopped)
  kDiagnosed,   // node: its diagnostics answer
  kSdcNan,      // the corruption shows: the loss is NaN
  kRefault,     // a persistent fault strikes again after a start
  kHangReport,  // every node reports the hung state (a second after the hang)
  kPlannedDown, // the node leaves for maintenance after the job's checkpoint
  kArrive,      // a node the scheduler brought registers
  kRepaired,    // an evicted or dead node is repaired: back in the scheduler's pool
  kEnd,         // the simulated time is up
};

struct SimEvent {
  Nanos at;
  std::uint64_t seq;
  Ev kind;
  int node;
  std::int64_t a;  // a generation, a round, a category
  bool operator>(const SimEvent& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

class Simulation;

// Keeps, as the controller records them, the events the report reads (a
// 30-day run at 100,000 GPUs records 17 million, nearly all ranks_started:
// reading them back cost a minute).
class ReportEvents final : public EventListener {
 public:
  void OnEvent(const Event& e) override {
    ++recorded;
    if (e.kind == "job_created" || e.kind == "first_step" || e.kind == "failure" || e.kind == "stopped" ||
        e.kind == "attribution" || e.kind == "decision" || e.kind == "job_succeeded" || e.kind == "job_failed") {
      kept.push_back(e);
    }
  }
  std::vector<Event> kept;
  std::int64_t recorded = 0;
};

class SimLink final : public AgentLink {
 public:
  SimLink(Simulation* sim, int node) : sim_(sim), node_(node) {}
  void Send(const v1::ControllerMessage& msg) override;
  void Close() override;
  Nanos LastHeardMono() const override;

 private:
  Simulation* sim_;
  int node_;
};

class SimProvider final : public NodeProvider {
 public:
  explicit SimProvider(Simulation* sim) : sim_(sim) {}
  void ReplaceNode(const std::string& node_id, const std::string& reason) override;
  bool EvictNode(const std::string& node_id, const std::string& reason) override;
  LossExplanation ExplainLoss(const std::string& node_id) override;

 private:
  Simulation* sim_;
};

class Simulation {
 public:
  Simulation(const SimParams& p, const FailureModel& m, const SimOptions& o)
      : p_(p), model_(m), opt_(o), rng_(p.seed), provider_(this) {
    nproc_ = p.gpus_per_node;
    nnodes_ = p.gpus / p.gpus_per_node;
    pace_s_ = p.step_s + p.checkpoint_blocked_s / StepsPerCheckpoint();
    // A healthy rank reports at least once per hang timeout (a margin of
    // two steps and 10 s): the hang detector never sees a healthy rank stale.
    round_ = Sec(std::max(1.0, p.hang_timeout_s - std::max(10.0, 2 * p.step_s) - p.heartbeat_interval_s));
    for (const auto& c : model_.categories) {
      SimCategoryStats s;
      s.name = c.name;
      s.hardware = c.hardware;
      result_.categories.push_back(s);
    }
  }

  StatusOr<SimResult> Run();

  // From the links and the provider (under the controller's lock: they
  // only schedule and mark).
  void OnCommand(int node, const v1::ControllerMessage& msg);
  void OnClose(int node);
  Nanos HeardOf(int node) const {
    const Node& n = nodes_[node];
    return n.alive && n.in_session ? clock_.MonotonicNanos() : n.heard_until;
  }
  void Replace(const std::string& id, bool evicted);
  LossExplanation Explain(const std::string& id);
  LossExplanation Explanation(const std::string& id) const;
  bool ReplacementComing() const { return p_.replacement_s >= 0 && (p_.pool < 0 || pool_left_ > 0); }

 private:
  struct Node {
    std::string id;
    std::shared_ptr<SimLink> link;
    bool alive = true;       // its host is up
    bool in_session = false; // connected (and not closed by the controller)
    Nanos heard_until = 0;   // when !alive: when it was last heard
    bool bad = false;        // of the bad-node subpopulation
    int broken = -1;         // a persistent fault's category, -1: none
    FailureSignal broken_signal = FailureSignal::kCrash;
    int down_category = -1;  // why its host went down
    int struck = -1;         // the category that last struck it: its kernel log shows it (Stopped)
    bool planned = false;    // it left for planned maintenance
    int group_rank = -1;
    std::int64_t generation = -1;
    bool ranks_running = false;
    bool gone = false;       // replaced or evicted: never back under this id
  };
  // The generation the nodes run.
  struct Gen {
    std::int64_t g = -1;
    Nanos launched = 0;
    Nanos first = kNever;     // its first step
    std::int64_t first_no = 0;
    Nanos frozen = kNever;    // its steps stopped (a failure, or Stop)
    bool hung = false;
    int hang_rank = -1;
    std::int64_t committed_before = -1;  // the newest checkpoint when it started
    std::int64_t extra_checkpoint = -1;  // a save outside the interval (planned maintenance)
  };

  std::int64_t StepsPerCheckpoint() const {
    return std::max<std::int64_t>(1, std::llround(p_.checkpoint_interval_s / p_.step_s));
  }
  // The newest step finished by `t` (first_no - 1: none yet).
  std::int64_t StepAt(Nanos t) const {
    t = std::min(t, gen_.frozen);
    if (gen_.first == kNever || t < gen_.first) return gen_.first_no - 1;
    return gen_.first_no + static_cast<std::int64_t>(ToSec(t - gen_.first) / pace_s_);
  }
  Nanos StepTime(std::int64_t n) const { return gen_.first + Sec((n - gen_.first_no) * pace_s_); }
  std::int64_t CheckpointsThrough(std::int64_t step) const {
    const std::int64_t k = StepsPerCheckpoint();
    if (step < gen_.first_no) return 0;
    return step / k - (gen_.first_no - 1) / k;
  }
  std::int64_t CommittedAt(Nanos t) const {
    std::int64_t step = StepAt(t), k = StepsPerCheckpoint();
    std::int64_t c = gen_.committed_before;
    if (step >= gen_.first_no && (step / k) * k >= gen_.first_no) c = std::max(c, (step / k) * k);
    return std::max(c, gen_.extra_checkpoint);
  }
  Nanos Wall(Nanos mono) const { return clock_.WallNanos() - clock_.MonotonicNanos() + mono; }

  void Schedule(Nanos at, Ev kind, int node = -1, std::int64_t a = 0) {
    queue_.push(SimEvent{at, seq_++, kind, node, a});
  }
  double Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  int AddNode();
  void Connect(int node);
  void Deliver(int node, v1::AgentMessage&& msg);  // its contents are taken
  void FillRanks(int node, Nanos now, google::protobuf::RepeatedPtrField<v1::RankStatus>* out, bool started);
  void Report(int node);  // one heartbeat
  void ReportAll();
  void ScheduleNextFault();
  void Inject(int category);
  void Strike(int node, int category, FailureSignal signal);
  void Crash(int node, int category);
  void Freeze(Nanos at);
  void Handle(const SimEvent& e);
  void EndJob();
  void Tally();

  const SimParams& p_;
  const FailureModel& model_;
  const SimOptions& opt_;
  std::mt19937_64 rng_;
  FakeClock clock_;
  SimProvider provider_;
  std::unique_ptr<EventStore> store_, write_store_;
  std::unique_ptr<JobController> ctl_;
  ReportEvents recorded_;
  int nproc_ = 8, nnodes_ = 1;
  double pace_s_ = 1;
  Nanos round_ = kSecond;
  Nanos first_round_ = kSecond;  // first step -> the first round
  Nanos start_mono_ = 0, end_mono_ = 0;
  std::vector<Node> nodes_;
  std::vector<int> slot_node_;  // group rank -> node
  std::map<std::string, int> node_by_id_;
  Gen gen_;
  std::map<std::int64_t, int> gen_cause_;  // generation -> the category that ended it
  std::priority_queue<SimEvent, std::vector<SimEvent>, std::greater<SimEvent>> queue_;
  std::uint64_t seq_ = 0;
  bool fault_outstanding_ = true;  // tick finely (the first start counts)
  Nanos sdc_since_ = -1;           // corruption under way since (mono), -1: none
  int pool_left_ = 0;
  bool ending_ = false;
  v1::AgentMessage scratch_;
  SimResult result_;
};

void SimLink::Send(const v1::ControllerMessage& msg) { sim_->OnCommand(node_, msg); }
void SimLink::Close() { sim_->OnClose(node_); }
Nanos SimLink::LastHeardMono() const { return sim_->HeardOf(node_); }
void SimProvider::ReplaceNode(const std::string& id, const std::string&) { sim_->Replace(id, false); }
bool SimProvider::EvictNode(const std::string& id, const std::string&) {
  bool coming = sim_->ReplacementComing();
  sim_->Replace(id, true);
  return coming;
}
LossExplanation SimProvider::ExplainLoss(const std::string& id) { return sim_->Explain(id); }

int Simulation::AddNode() {
  Node n;
  n.id = "n" + std::to_string(nodes_.size());
  n.bad = model_.bad_node_fraction > 0 && Uniform() < model_.bad_node_fraction;
  nodes_.push_back(std::move(n));
  int i = static_cast<int>(nodes_.size()) - 1;
  nodes_[i].link = std::make_shared<SimLink>(this, i);
  node_by_id_[nodes_[i].id] = i;
  return i;
}

void Simulation::Connect(int i) {
  Node& n = nodes_[i];
  n.in_session = true;
  if (opt_.trace != nullptr) {
    SimTraceEntry t;
    t.kind = SimTraceEntry::kConnect;
    t.at = clock_.MonotonicNanos() - start_mono_;
    t.node = i;
    opt_.trace->push_back(std::move(t));
  }
  ctl_->OnConnect(static_cast<std::uint64_t>(i) + 1, n.link);
  scratch_.Clear();
  auto* r = scratch_.mutable_register_();
  r->set_protocol_version(kProtocolVersion);
  r->set_node_id(n.id);
  r->set_hostname(n.id);
  r->set_address("10." + std::to_string(i / 65536 % 256) + "." + std::to_string(i / 256 % 256) + "." +
                 std::to_string(i % 256));
  r->set_nproc_per_node(nproc_);
  r->set_free_port(29500);
  r->set_pid(100 + i);
  r->set_runs_diagnostics(p_.diagnose != "off");
  Deliver(i, std::move(scratch_));
}

void Simulation::Deliver(int i, v1::AgentMessage&& msg) {
  ++result_.messages;
  if (opt_.trace != nullptr) {
    SimTraceEntry t;
    t.at = clock_.MonotonicNanos() - start_mono_;
    t.node = i;
    t.msg = msg;
    opt_.trace->push_back(std::move(t));
  }
  ctl_->OnMessage(static_cast<std::uint64_t>(i) + 1, std::move(msg), clock_.MonotonicNanos());
}

void Simulation::FillRanks(int i, Nanos now, google::protobuf::RepeatedPtrField<v1::RankStatus>* out, bool started) {
  const Node& n = nodes_[i];
  const std::int64_t step = started ? gen_.first_no - 1 : StepAt(now);
  const bool stepped = step >= gen_.first_no;
  const std::int64_t committed = CommittedAt(now);
  const std::int64_t blocked_us = stepped ? static_cast<std::int64_t>(CheckpointsThrough(step) * p_.checkpoint_blocked_s * 1e6) : 0;
  const Nanos last = stepped ? StepTime(step) : gen_.launched;
  for (int l = 0; l < nproc_; ++l) {
    v1::RankStatus* r = out->Add();
    const int global = n.group_rank * nproc_ + l;
    r->set_local_rank(l);
    r->set_global_rank(global);
    r->set_running(true);
    r->set_pid(1000 + global);
    r->set_attached(true);
    r->set_step(stepped ? step : -1);
    r->set_step_count(stepped ? step - gen_.first_no + 1 : 0);
    r->set_progress_age_ms(std::max<Nanos>(0, now - last) / kMillisecond);
    if (stepped) {
      r->set_first_step_unix_ms(Wall(gen_.first) / kMillisecond);
      r->set_last_step_unix_ms(Wall(last) / kMillisecond);
    }
    r->set_checkpoint_step(committed);
    r->set_checkpoint_blocked_ms(blocked_us / 1000);
    r->set_checkpoint_blocked_us(blocked_us);
    r->set_phase(stepped ? "forward" : "");
    r->set_proc_state("R");
    r->set_activity_sampled(true);
    if (gen_.hung && gen_.frozen <= now) {
      // The stuck rank never reached the next collective; its peers wait in
      // it (NCCL's waiters spin: busy, not quiet).
      const std::int64_t issued = step + 1;
      auto* g = r->add_groups();
      g->set_id(0);
      g->set_name("default_pg");
      g->set_size(nnodes_ * nproc_);
      g->set_first(0);
      g->set_stride(1);
      const bool culprit = global == gen_.hang_rank;
      g->set_issued(culprit ? issued - 1 : issued);
      g->set_completed(issued - 1);
      if (culprit) {
        r->set_activity_age_ms((now - gen_.frozen) / kMillisecond);
        r->set_proc_state("S");
      } else {
        auto* op = r->add_ops_in_flight();
        op->set_group_id(0);
        op->set_seq(issued);
        op->set_op("all_reduce");
        op->set_dtype("bfloat16");
        op->set_numel(1 << 26);
        op->set_peer(-1);
        op->set_age_ms((now - gen_.frozen) / kMillisecond);
        op->set_duration_ms(-1);
      }
    }
  }
}

void Simulation::Report(int i) {
  const Node& n = nodes_[i];
  if (!n.alive || !n.in_session || !n.ranks_running || n.generation != gen_.g) return;
  scratch_.Clear();
  auto* hb = scratch_.mutable_heartbeat();
  hb->set_generation(n.generation);
  Nanos now = clock_.MonotonicNanos();
  FillRanks(i, now, hb->mutable_ranks(), false);
  hb->set_sent_unix_ms(Wall(now) / kMillisecond);
  Deliver(i, std::move(scratch_));
}

void Simulation::ReportAll() {
  for (int node : slot_node_) {
    if (node >= 0) Report(node);
  }
}

void Simulation::ScheduleNextFault() {
  // Faults strike the job's nodes: a bad node `multiplier` times as often.
  double weight = nnodes_ * (1 + model_.bad_node_fraction * (model_.bad_node_multiplier - 1));
  double per_s = model_.PerNodeDay() * weight / 86400.0;
  double wait = -std::log(1.0 - Uniform()) / per_s;
  Schedule(clock_.MonotonicNanos() + Sec(wait), Ev::kFault);
}

void Simulation::Inject(int category) {
  const FailureCategory& c = model_.categories[category];
  // The node: a slot at random, bad nodes weighted up (rejection sampling).
  int node = -1;
  for (int tries = 0; tries < 1000 && node < 0; ++tries) {
    int slot = static_cast<int>(Uniform() * nnodes_);
    int candidate = slot < static_cast<int>(slot_node_.size()) ? slot_node_[slot] : -1;
    if (candidate < 0) continue;
    double w = nodes_[candidate].bad ? model_.bad_node_multiplier : 1.0;
    if (Uniform() * model_.bad_node_multiplier <= w) node = candidate;
  }
  if (node < 0) return;
  double u = Uniform(), acc = 0;
  FailureSignal signal = c.signals.back().first;
  for (const auto& [s, w] : c.signals) {
    acc += w;
    if (u < acc) {
      signal = s;
      break;
    }
  }
  ++result_.faults;
  ++result_.categories[category].injected;
  Node& n = nodes_[node];
  if (!n.alive) return;  // it is already down
  if (Uniform() < c.persistent && signal != FailureSignal::kPlanned) {
    n.broken = category;
    n.broken_signal = signal;
  }
  Strike(node, category, signal);
}

void Simulation::Freeze(Nanos at) {
  if (gen_.frozen == kNever) gen_.frozen = at;
}

void Simulation::Strike(int node, int category, FailureSignal signal) {
  Node& n = nodes_[node];
  const Nanos now = clock_.MonotonicNanos();
  const bool running = n.ranks_running && n.generation == gen_.g && gen_.frozen == kNever;
  n.struck = category;
  if (signal == FailureSignal::kNodeDown) {
    if (running && !gen_cause_.count(gen_.g)) gen_cause_[gen_.g] = category;
    if (running) Freeze(now);
    n.alive = false;
    n.heard_until = now;
    n.down_category = category;
    fault_outstanding_ = true;
    if (opt_.trace != nullptr) {
      SimTraceEntry t;
      t.kind = SimTraceEntry::kDown;
      t.at = now - start_mono_;
      t.node = node;
      opt_.trace->push_back(std::move(t));
    }
    return;
  }
  if (signal == FailureSignal::kPlanned) {
    if (!running) return;
    // The job saves first (planned), then the host leaves.
    gen_.extra_checkpoint = StepAt(now);
    Report(node);
    Schedule(now + Sec(1), Ev::kPlannedDown, node, category);
    return;
  }
  if (!running) {
    ++result_.faults_while_down;
    return;
  }
  if (signal == FailureSignal::kSdc) {
    if (sdc_since_ < 0) sdc_since_ = now;
    Schedule(now + Sec(model_.categories[category].latency_hours * 3600), Ev::kSdcNan, node, category);
    return;
  }
  if (!gen_cause_.count(gen_.g)) gen_cause_[gen_.g] = category;
  fault_outstanding_ = true;
  Freeze(now);
  if (signal == FailureSignal::kHang) {
    gen_.hung = true;
    gen_.hang_rank = n.group_rank * nproc_ + static_cast<int>(Uniform() * nproc_);
    Schedule(now + Sec(p_.heartbeat_interval_s), Ev::kHangReport, -1, gen_.g);
    return;
  }
  Crash(node, category);
}

void Simulation::Crash(int node, int category) {
  const FailureCategory& c = model_.categories[category];
  const Nanos now = clock_.MonotonicNanos();
  scratch_.Clear();
  auto* ex = scratch_.mutable_rank_exited();
  ex->set_generation(nodes_[node].generation);
  google::protobuf::RepeatedPtrField<v1::RankStatus> ranks;
  FillRanks(node, now, &ranks, false);
  *ex->mutable_rank() = ranks.Get(static_cast<int>(Uniform() * nproc_));
  ex->mutable_rank()->set_running(false);
  ex->mutable_rank()->set_exit_code(c.signal != 0 ? 0 : c.exit_code);
  ex->mutable_rank()->set_term_signal(c.signal);
  for (const auto& l : c.log_tail) ex->add_log_tail(l);
  for (const auto& l : c.kernel_lines) ex->add_kernel_lines(l);
  ex->set_exit_unix_ms(Wall(now) / kMillisecond);
  Deliver(node, std::move(scratch_));
}

void Simulation::OnCommand(int i, const v1::ControllerMessage& msg) {
  ++result_.commands;
  Node& n = nodes_[i];
  const Nanos now = clock_.MonotonicNanos();
  if (!n.alive) return;
  switch (msg.kind_case()) {
    case v1::ControllerMessage::kStart: {
      const v1::Start& s = msg.start();
      n.generation = s.generation();
      n.group_rank = s.group_rank();
      n.ranks_running = true;
      if (static_cast<int>(slot_node_.size()) <= s.group_rank()) slot_node_.resize(s.group_rank() + 1, -1);
      slot_node_[s.group_rank()] = i;
      if (gen_.g != s.generation()) {
        std::int64_t committed = gen_.g >= 0 ? CommittedAt(now) : -1;
        if (sdc_since_ >= 0) committed = gen_.committed_before;  // rolled back past the corruption
        gen_ = Gen{};
        gen_.g = s.generation();
        gen_.launched = now;
        gen_.first = now + Sec(p_.restart_s);
        gen_.first_no = committed + 1;
        gen_.committed_before = committed;
        sdc_since_ = -1;
        Schedule(gen_.first, Ev::kFirstStep, -1, gen_.g);
        Schedule(StepTime((gen_.first_no / StepsPerCheckpoint() + 1) * StepsPerCheckpoint()) +
                     Sec(p_.checkpoint_blocked_s), Ev::kCheckpoint, -1, gen_.g);
      }
      Schedule(now + 50 * kMillisecond, Ev::kStarted, i, s.generation());
      if (n.broken >= 0) Schedule(gen_.first + Sec(30), Ev::kRefault, i, s.generation());
      break;
    }
    case v1::ControllerMessage::kStop:
      if (n.generation == gen_.g) Freeze(now);
      Schedule(now + Sec(p_.shutdown_s), Ev::kStopped, i, msg.stop().generation());
      break;
    case v1::ControllerMessage::kRunDiagnostics:
      Schedule(now + Sec(p_.diagnose_s), Ev::kDiagnosed, i, msg.run_diagnostics().round() * 2 +
                                                            (msg.run_diagnostics().collective() ? 1 : 0));
      break;
    case v1::ControllerMessage::kShutdown:
      n.ranks_running = false;
      break;
    default: break;  // Welcome, ClockProbe
  }
}

void Simulation::OnClose(int i) {
  Node& n = nodes_[i];
  if (n.in_session && n.alive) n.heard_until = clock_.MonotonicNanos();
  n.in_session = false;
  n.ranks_running = false;
}

void Simulation::Replace(const std::string& id, bool evicted) {
  auto it = node_by_id_.find(id);
  if (it == node_by_id_.end()) return;
  Node& n = nodes_[it->second];
  if (n.gone) return;
  n.gone = true;
  n.ranks_running = false;
  if (n.alive) {
    n.heard_until = clock_.MonotonicNanos();
    if (opt_.trace != nullptr) {
      SimTraceEntry t;
      t.kind = SimTraceEntry::kDown;
      t.at = clock_.MonotonicNanos() - start_mono_;
      t.node = it->second;
      opt_.trace->push_back(std::move(t));
    }
  }
  n.alive = false;  // killed: it will not be heard again
  // It is back in the scheduler's pool once repaired (or, healthy, at once).
  int cat = n.broken >= 0 ? n.broken : n.down_category;
  double hours = cat >= 0 ? model_.categories[cat].repair_hours : 0;
  if (p_.pool >= 0) Schedule(clock_.MonotonicNanos() + Sec(hours * 3600), Ev::kRepaired);
  if (!ReplacementComing()) return;
  if (p_.pool > 0) --pool_left_;
  ++result_.replacements;
  Schedule(clock_.MonotonicNanos() + Sec(p_.replacement_s), Ev::kArrive);
}

LossExplanation Simulation::Explain(const std::string& id) {
  LossExplanation e = Explanation(id);
  if (opt_.explained != nullptr) (*opt_.explained)[id] = e;
  return e;
}

LossExplanation Simulation::Explanation(const std::string& id) const {
  auto it = node_by_id_.find(id);
  if (it == node_by_id_.end()) return {};
  const Node& n = nodes_[it->second];
  if (n.alive) return {};  // the scheduler sees nothing wrong
  if (n.planned) {
    return {"the scheduler drained node " + id + " for planned maintenance", AgentExitedVerdict()};
  }
  if (n.down_category >= 0) return {"the scheduler reports node " + id + " DOWN (not responding)", HostDownVerdict(id)};
  return {};
}

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
      scratch_.Clear();
      auto* s = scratch_.mutable_started();
      s->set_generation(e.a);
      FillRanks(e.node, now, s->mutable_ranks(), true);
      s->set_started_unix_ms(Wall(now) / kMillisecond);
      Deliver(e.node, std::move(scratch_));
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
    case Ev::kCheckpoint: {
      if (e.a != gen_.g || gen_.frozen <= now) break;
      if (!slot_node_.empty() && slot_node_[0] >= 0) Report(slot_node_[0]);
      std::int64_t k = StepsPerCheckpoint();
      std::int64_t next = (StepAt(now) / k + 1) * k;
      Schedule(StepTime(next) + Sec(p_.checkpoint_blocked_s), Ev::kCheckpoint, -1, e.a);
      break;
    }
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
  // The first round comes before any rank's startup timeout runs out.
  first_round_ = std::max(kSecond, c.startup_timeout - Sec(p_.restart_s) - 10 * kSecond);
  ctl_ = std::make_unique<JobController>(c, &clock_, store_.get(), &provider_, opt_.rules, write_store_.get());
  ctl_->SetOffLockThreads(0);
  ctl_->SetEventListener(&recorded_);
  TG_RETURN_IF_ERROR(ctl_->Start());
  pool_left_ = p_.pool;

  const auto real0 = std::chrono::steady_clock::now();
  const double cpu0 = CpuSeconds();
  start_mono_ = clock_.MonotonicNanos();
  end_mono_ = start_mono_ + Sec(p_.days * 86400);
  for (int i = 0; i < nnodes_ + p_.spares; ++i) Connect(AddNode());
  ScheduleNextFault();
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
  result_.ettr_true = wall > 0 ? result_.report.ettr - result_.sdc_redone_s / wall : 0;
}

}  // namespace

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
  c.startup_timeout = std::max(c.startup_timeout, Sec(p.restart_s * 2 + 60));
  c.diagnose = p.diagnose;
  c.diag_timeout = std::max(c.diag_timeout, Sec(p.diagnose_s * 3));
  c.rendezvous_timeout = Sec(p.rendezvous_timeout_s > 0 ? p.rendezvous_timeout_s
                                                         : std::max(300.0, 2 * std::max(0.0, p.replacement_s)));
  c.no_progress_restarts = p.no_progress_restarts;
  // The nodes share the simulated clock: no offset to learn.
  c.clock_probe_interval = 3600 * kSecond;
  c.watch_gap_grace = 0;  // the simulated clock leaps
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
