// The simulation behind trainguard sim (simulator.h), private to src/sim:
// simulated nodes that send the agents' messages to the real controller on a
// FakeClock, the scheduler they answer to, and the event queue that drives
// them. Split by concern: sim_nodes.cc (the nodes, their links and the
// scheduler), sim_faults.cc (failures drawn and struck), sim_checkpoints.cc
// (steps, saves to the memory and storage tiers, the restore point),
// sim_stragglers.cc (nodes that slow the job, and the timings the straggler
// detector sees), simulator.cc (the event loop, the end of the job and the
// tally).
#pragma once

#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/job_controller.h"
#include "sim/simulator.h"
#include "store/event_store.h"

namespace trainguard::sim_detail {

constexpr Nanos kNever = std::numeric_limits<Nanos>::max();
inline Nanos Sec(double s) { return static_cast<Nanos>(std::llround(s * 1e9)); }
inline double ToSec(Nanos n) { return static_cast<double>(n) / 1e9; }

// What happens next, in simulated time. Ties go in the order scheduled.
enum class Ev : std::uint8_t {
  kFault,       // the next failure is drawn
  kStarted,     // node: its ranks were spawned (RanksStarted)
  kFirstStep,   // the generation made its first step: every node reports
  kRound,       // every node of the generation reports (a heartbeat each)
  kCheckpoint,  // a save ends its blocking: rank 0's node reports it
  kPeerCopied,  // a save's push to the peers' memory ended (node: the generation, a: the step)
  kPersisted,   // a save's write to storage ended (node: the generation, a: the step)
  kStopped,     // node: its ranks stopped (Stopped)
  kDiagnosed,   // node: its diagnostics answer
  kSdcNan,      // the corruption shows: the loss is NaN
  kSdcShows,    // a diverged rank's fingerprint is taken: every node reports (a heartbeat later)
  kRefault,     // a persistent fault strikes again after a start
  kHangReport,  // every node reports the hung state (a second after the hang)
  kPlannedDown, // the node leaves for maintenance after the job's checkpoint
  kArrive,      // a node the scheduler brought registers
  kRepaired,    // an evicted or dead node is repaired: back in the scheduler's pool
  kDisconnect,  // node: its host died; the transport closes its session (gRPC keepalive)
  kSlow,        // the next straggler strikes (drawn when the one before struck)
  kPreWatch,    // the next straggler's place starts sending timings (its baseline)
  kSlowEnd,     // node: its slowdown `a` ends
  kTimings,     // the watched nodes send their steps' timings (a: the generation)
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
// reading them back cost a minute). Not the commits: the report counts the
// saves from the job's end (rank 0's count, never fewer than the commits).
class ReportEvents final : public EventListener {
 public:
  void OnEvent(const Event& e) override {
    ++recorded;
    if (e.kind == "straggler") {
      stragglers.push_back(e);
      named.insert(e.node);
    }
    if (e.kind == "straggler_cleared") named.erase(e.node);
    if (e.kind == "job_created" || e.kind == "first_step" || e.kind == "failure" || e.kind == "stopped" ||
        e.kind == "attribution" || e.kind == "decision" || e.kind == "downtime" || e.kind == "job_succeeded" ||
        e.kind == "job_failed" || e.kind == "checkpoint_plan") {
      kept.push_back(e);
    }
  }
  std::vector<Event> kept;
  std::vector<Event> stragglers;  // the detector's namings
  std::set<std::string> named;    // nodes named and not cleared
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
      : p_(p), model_(m), opt_(o), rng_(p.seed), provider_(this), slow_rng_(p.seed * 0x9E3779B97F4A7C15ULL + 7) {
    nproc_ = p.gpus_per_node;
    nnodes_ = p.gpus / p.gpus_per_node;
    memory_every_s_ = p.memory_interval_s;
    storage_every_s_ = p.checkpoint_interval_s;
    // A healthy rank reports at least once per hang timeout (a margin of
    // two steps and 10 s): the hang detector never sees a healthy rank stale.
    round_ = Sec(std::max(1.0, p.hang_timeout_s - std::max(10.0, 2 * p.step_s) - p.heartbeat_interval_s));
    for (const auto& c : model_.categories) {
      SimCategoryStats s;
      s.name = c.name;
      s.hardware = c.hardware;
      result_.categories.push_back(s);
    }
    if (model_.stragglers.enabled()) {
      // Their evictions, beside the failures' categories.
      SimCategoryStats s;
      s.name = "straggler";
      s.hardware = true;
      straggler_category_ = static_cast<int>(result_.categories.size());
      result_.categories.push_back(s);
    }
    gen_.step_s = p.step_s;
  }

  StatusOr<SimResult> Run();

  // From the links and the provider (under the controller's lock: they
  // only schedule and mark).
  void OnCommand(int node, const v1::ControllerMessage& msg);
  void OnClose(int node);
  // The controller asks this of every node every few seconds: from a
  // compact array (100 KB at 12,500 nodes), not from the nodes themselves.
  Nanos HeardOf(int node) const {
    const Nanos heard = heard_[static_cast<std::size_t>(node)];
    return heard == kLive ? clock_.MonotonicNanos() : heard;
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
    int sdc_local = -1;      // the GPU of a corrupting defect that stays (a persistent sdc)
    double slow = 1;         // its steps take this many times as long (a straggler)
    bool slow_visible = false;  // in its own compute (else in every node's collectives)
    std::int64_t slow_id = -1;  // the slowdown's (its end event carries it)
    std::int64_t fp_generation = -1;  // the generation whose first fingerprints it reported
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
    std::int64_t restored = -1;  // the checkpoint it resumed from (-1: none)
    // Its steps, one every step_s (the slowest node's pace): step seg_step
    // ended at seg_done, the next one runs from seg_t (later by a save's
    // blocking); the ranks wait after save_step until that save ends its
    // blocking (the save's event carries save_token).
    std::int64_t seg_step = 0;
    Nanos seg_done = kNever, seg_t = kNever;
    double step_s = 0;
    double slowdown = 1;      // step_s over the healthy step
    Nanos slow_mark = 0;      // the slowed time is counted up to here
    std::int64_t save_step = std::numeric_limits<std::int64_t>::max();
    int save_token = 0;
    std::int64_t saves = 0;  // the ranks' saves and the time they blocked
    Nanos blocked = 0;
  };
  // The job's checkpoints, across generations (sim_checkpoints.cc).
  struct Checkpoints {
    std::int64_t local = -1;    // the newest save in its nodes' memory
    std::int64_t local_prev = -1;  // the one before it, also kept there
    std::int64_t peer = -1;     // the newest whose push to the peers ended
    std::int64_t storage = -1;  // the newest whole in storage
    Nanos persist_until = 0;    // when the write to storage under way ends
    std::int64_t last_storage_save = std::numeric_limits<std::int64_t>::min() / 2;
    Nanos last_node_loss = -1;  // a push under way then did not end
    std::deque<std::pair<Nanos, std::int64_t>> storage_saves;  // (saved at, step), for rollbacks
  };

  // The newest step finished by `t` (first_no - 1: none yet).
  std::int64_t StepAt(Nanos t) const {
    t = std::min(t, gen_.frozen);
    if (gen_.first == kNever || t < gen_.first) return gen_.first_no - 1;
    if (t < gen_.seg_t) return gen_.seg_step;
    return std::min(gen_.save_step, gen_.seg_step + static_cast<std::int64_t>(ToSec(t - gen_.seg_t) / gen_.step_s));
  }
  // When step `n` ends (n at or after the segment's step).
  Nanos StepTime(std::int64_t n) const {
    return n <= gen_.seg_step ? gen_.seg_done : gen_.seg_t + Sec(static_cast<double>(n - gen_.seg_step) * gen_.step_s);
  }
  bool MemoryTier() const { return memory_every_s_ > 0; }
  // What a restart could resume from now: a rank's own node's memory, or storage.
  std::int64_t Restorable() const { return MemoryTier() ? std::max(ckpt_.local, ckpt_.storage) : ckpt_.storage; }
  Nanos Wall(Nanos mono) const { return clock_.WallNanos() - clock_.MonotonicNanos() + mono; }

  void Schedule(Nanos at, Ev kind, int node = -1, std::int64_t a = 0) {
    queue_.push(SimEvent{at, seq_++, kind, node, a});
  }
  double Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  int AddNode();
  // heard_ of a node from its state: after alive, in_session or heard_until change.
  void SetHeard(int node) {
    const Node& n = nodes_[node];
    heard_[static_cast<std::size_t>(node)] = n.alive && n.in_session ? kLive : n.heard_until;
  }
  void Connect(int node);
  void Deliver(int node, v1::AgentMessage&& msg);  // its contents are taken
  void FillRanks(int node, Nanos now, google::protobuf::RepeatedPtrField<v1::RankStatus>* out, bool started);
  // Fingerprints are compared when they are taken and each set of
  // replicas has a strict majority (3 or more).
  bool Fingerprinted() const { return p_.fingerprint_every > 0 && p_.gpus / p_.ModelParallel() >= 3; }
  std::uint64_t Fingerprint(int global, std::int64_t step) const;
  void AddFingerprints(int node, Nanos now, google::protobuf::RepeatedPtrField<v1::RankStatus>* ranks);
  void Report(int node);  // one heartbeat
  void ReportAll();
  void ScheduleNextFault();
  // The node a fault strikes: a job node's slot or an idle spare, at
  // random, bad nodes weighted up; -1: the drawn place is empty.
  int PickNode();
  int IdleSpare(int k) const;  // the k-th idle spare, -1: fewer
  void Inject(int category);
  void Strike(int node, int category, FailureSignal signal);
  void Crash(int node, int category);
  // Checkpoints (sim_checkpoints.cc).
  void StartSteps(std::int64_t g, Nanos launched, Nanos now);  // a new generation: its restore point and first step
  void ScheduleSave();
  void Save(Nanos now);
  void SavedToPeer(Nanos at, std::int64_t step);
  void SavedToStorage(Nanos at, std::int64_t generation, std::int64_t step);
  void SaveEverywhere(std::int64_t step, Nanos now);  // planned maintenance: a whole save first
  void NodeLost(int group_rank);
  void ApplyPlan(const v1::CheckpointPlan& plan);
  void Freeze(Nanos at);
  // Stragglers (sim_stragglers.cc).
  void ScheduleNextSlow();
  void PreWatch();
  void Slow();                                  // one drawn: a node slows
  void SlowEnds(int node, std::int64_t id);
  bool InJob(int node) const;                   // a node of the running generation
  void Repace(Nanos now);                       // the job's pace from its slowest node
  void CountSlowed(Nanos now);                  // the slowed time, up to now
  void Watch(Nanos now);                        // timings flow while a node is slow
  void SendTimings(Nanos now, int also_slot = -1);
  void TimingsDue(std::int64_t generation);   // the watch's next send
  bool SlowVisible() const;  // a node of the job slow in its compute
  bool SlowUnnamed() const;  // a node of the job slow in its compute, not named
  void ScheduleCheckpointEvent();
  void Handle(const SimEvent& e);
  void EndJob();
  void Tally();
  void TallyStragglers();  // which slowdowns were named, and how soon

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
  Checkpoints ckpt_;
  double memory_every_s_ = 0, storage_every_s_ = 0;  // the intervals saves follow (auto: the plan's)
  std::set<int> lost_slots_;  // group ranks whose node was lost since the generation started
  int storage_restores_ = 0;  // generations restored from storage
  bool striking_peer_ = false;  // a host loss takes its peer along (no further)
  Nanos round_ = kSecond;
  Nanos first_round_ = kSecond;  // first step -> the first round
  Nanos start_mono_ = 0, end_mono_ = 0;
  std::vector<Node> nodes_;
  static constexpr Nanos kLive = std::numeric_limits<Nanos>::min();  // heard_: alive and in session: heard now
  std::vector<Nanos> heard_;  // by node
  std::vector<int> slot_node_;  // group rank -> node
  std::map<std::string, int> node_by_id_;
  Gen gen_;
  std::map<std::int64_t, int> gen_cause_;  // generation -> the category that ended it
  std::priority_queue<SimEvent, std::vector<SimEvent>, std::greater<SimEvent>> queue_;
  std::uint64_t seq_ = 0;
  bool fault_outstanding_ = true;  // tick finely (the first start counts)
  Nanos sdc_since_ = -1;           // corruption under way since (mono), -1: none
  // A defect that diverged a rank's parameters from its replicas': the rank,
  // the first step it diverged at, the category (-1: none).
  int sdc_rank_ = -1;
  std::int64_t sdc_step_ = -1;
  int sdc_category_ = -1;
  std::int64_t resume_at_most_ = -1;  // the controller's rollback bound in the Start (-1: none)
  // Stragglers: their own random stream (the failures' is unchanged), the
  // slow nodes, and the timings the watched nodes send (sim_stragglers.cc).
  // Agents send timings with every heartbeat; the watched nodes, every 5 steps.
  static constexpr std::int64_t kTimingsEvery = 5;
  std::mt19937_64 slow_rng_;
  std::int64_t slow_seq_ = 0;
  // The next slowdown, drawn ahead: where (a job slot, or a spare's place
  // from nnodes_ on), how much, how long.
  struct NextSlow {
    int place = -1;
    double factor = 1, minutes = 0;
    bool visible = false;
  } next_slow_;
  std::set<int> slow_nodes_;
  int straggler_category_ = -1;  // its row in result_.categories
  struct Watching {
    bool on = false;
    std::int64_t generation = -1;
    std::int64_t from = 0;         // the first step sent
    std::int64_t until = -1;       // sent up to this step after the last slowdown ended (-1: one lasts)
    std::vector<int> peers;        // group ranks of the healthy sample
    int pending = -1;              // the group rank the next slowdown strikes
    bool paused = false;           // the slow nodes are named (report): until one recovers
    std::map<int, std::int64_t> sent_to;  // group rank -> its newest step sent
  } watch_;
  int pool_left_ = 0;
  bool ending_ = false;
  v1::AgentMessage scratch_;
  // Heartbeats and starts (most messages, 8 ranks each) keep a message of
  // their own: cleared in place, their ranks' storage is reused instead of
  // freed and allocated again.
  v1::AgentMessage heartbeat_;
  v1::AgentMessage started_;
  SimResult result_;
};

}  // namespace trainguard::sim_detail
