// JobController: the per-job state machine. It wires the detectors
// (crash_detector, hang_detector, heartbeat_detector), which find failures in
// a read-only JobView, and its components (the node registry,
// node_registry.h; the SDC monitor, sdc_monitor.h; the straggler detector;
// the telemetry ingest, telemetry_ingest.h, which needs no job lock; the
// diagnosis coordinator, diagnosis_coordinator.h; the link monitor), which keep and judge what they own,
// to the recovery policy (recovery_policy), which says what to do about
// them, and carries that out. One loop moves the job from
// state to state (Reconcile, job_controller_reconcile.cc); handlers and Tick
// only record what they observed and the findings.
//
//   STARTING --all nodes registered--> RUNNING --all ranks exit 0--> SUCCEEDED
//   RUNNING --rank failed | hang | node lost--> STOPPING --all stopped-->
//   RESTARTING --all nodes present--> RUNNING ...   (restart count + 1 each time)
//   STOPPING --restart count would exceed max_restarts--> FAILED
//   STOPPING --all stopped, diagnose on--> DIAGNOSING --all answered--> RESTARTING
//   STARTING --all nodes registered, diagnose on, first time--> DIAGNOSING --> STARTING
//
// Nodes beyond nnodes (up to `spares`) register as idle spares; an empty
// group rank (evicted or lost node) is given to a spare at the restart.
// Evicted nodes are cordoned in the store, and cordoned nodes are refused.
// An elastic job (min_nnodes < nnodes) starts without empty group ranks
// nobody will fill, or after elastic_wait, renumbering the nodes it has.
//
// It knows nothing of sockets or processes: a transport feeds it agent
// messages and connection events and hands it an AgentLink per connection; a
// NodeProvider (the scheduler backend) replaces lost nodes; time comes from an
// injected Clock and deadlines are checked in Tick(), which the daemon calls
// periodically (every 50 ms) and tests call after advancing a FakeClock.
// Every decision is appended to the EventStore with its evidence.
//
// Store I/O. Writes (events, incidents, cordons, job state, diagnostics,
// timings) never run under the controller's mutex: they are enqueued, in
// order, on a StoreWriter (store/store_writer.h) whose thread writes them and
// retries them while the store is away; a full queue holds a caller up for
// at most StoreWriter::Options::backpressure_wait. Only the
// generation_started event is waited for, briefly (start_record_wait), and
// off the lock, before its Start is sent (docs/events.md, "what is durable
// when"). Reads
// run off the lock: the job's record before Start/Resume take it, the
// nodes' health into a cache (node_health_cache.h) at the start, every
// JobConfig::health_refresh and with each incident's blame, other jobs' incidents with
// the blame; decisions under the lock read the cache, behind the writer's
// queued cordons.
//
// Thread safety: all public methods may be called from any thread; one mutex
// serializes them, except for step timings and clock echoes, which the
// telemetry ingest takes under a lock of its own. AgentLink::Send and NodeProvider::ReplaceNode are called
// with that mutex held and must not block or call back into the controller.
// What takes seconds at a fleet's size runs off the mutex, on threads of
// OffLockRunner (off_lock_runner.h), and comes back through Tick: asking
// the scheduler why a node was lost (NodeProvider::ExplainLoss), and
// blaming an incident (its lines through the rules, the fleet's history).
// Scale: docs/scale.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "attribution/attribution.h"
#include "common/clock.h"
#include "controller/agent_link.h"
#include "controller/downtime.h"
#include "controller/event_kind.h"
#include "controller/event_listener.h"
#include "controller/checkpoint_policy.h"
#include "controller/diagnosis_coordinator.h"
#include "controller/fleet_history.h"
#include "controller/finding.h"
#include "controller/incident.h"
#include "controller/job_config.h"
#include "controller/job_snapshot.h"
#include "controller/job_view.h"
#include "controller/link_monitor.h"
#include "controller/node_health_cache.h"
#include "controller/node_registry.h"
#include "controller/node_provider.h"
#include "controller/recovery_policy.h"
#include "controller/sdc_monitor.h"
#include "controller/straggler_cause.h"
#include "controller/straggler_detector.h"
#include "controller/telemetry_ingest.h"
#include "proto/protocol.h"
#include "store/event_store.h"
#include "store/store_writer.h"

namespace trainguard {

class OffLockRunner;

enum class JobState { kStarting, kRunning, kStopping, kDiagnosing, kRestarting, kSucceeded, kFailed };
const char* JobStateName(JobState s);

class JobController {
 public:
  // `store` and `clock` must outlive the controller; `provider` may be null
  // (lost nodes are then waited for until rendezvous_timeout). `rules` may be
  // null: incidents are then not attributed and every failure is restarted.
  // `write_store` (default: `store`) is what the writer thread writes to: a
  // connection of its own, so that a write that waits on the server never
  // holds up the controller's reads.
  JobController(JobConfig config, Clock* clock, EventStore* store, NodeProvider* provider,
                const RuleSet* rules = nullptr, EventStore* write_store = nullptr);
  // Drains the store writer (bounded): false when writes are still queued.
  ~JobController();

  // Replaces the node provider (null: none). Takes effect for the next loss;
  // returns once the old one is no longer being asked why a node was lost.
  void SetNodeProvider(NodeProvider* provider);
  // Threads that explain lost nodes off the lock (off_lock_runner.h),
  // default 4, incidents being blamed on one more; 0: both inline, under
  // the lock (unit tests whose fakes answer at once).
  void SetOffLockThreads(int threads);
  // Every event recorded from now on also goes to `listener` (null: none).
  void SetEventListener(EventListener* listener);

  // Records the job in the store. Call once. Agents that register before it
  // (a listening server may accept them first) are welcomed by Start.
  Status Start();
  // Instead of Start, for a job the store has and that has not ended (its
  // controller died): rebuilds the job from its events and, if it was
  // running, waits reconnect_window for its agents to come back with their
  // ranks; those that do not are lost nodes. A job that died mid-recovery
  // restarts once its nodes are back. Records "controller_restarted".
  // NotFound / FailedPrecondition if there is nothing to resume.
  Status Resume();

  void OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink> link);
  // `arrived_mono`: when the transport received it (the controller's
  // monotonic clock; 0: now). Clock echoes are timed by it, not by when the
  // controller got to them.
  void OnMessage(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived_mono = 0);
  // The same, taking the message's contents: rank statuses are moved into
  // the controller's view, not copied (a fifth of a heartbeat's cost).
  void OnMessage(std::uint64_t conn, v1::AgentMessage&& msg, Nanos arrived_mono = 0);
  void OnDisconnect(std::uint64_t conn);
  void Tick();
  // Stops every rank and fails the job (user interrupt).
  void Cancel(const std::string& reason);

  JobState state() const;
  int restart_count() const;
  std::string summary() const;
  // The exit status `trainguard run` gives a failed job: the exit code of the
  // rank whose failure opened the last incident, 128 + its signal if it was
  // killed, 1 for anything else (hangs, lost nodes, restart limits on those).
  int FailureExitStatus() const;
  bool finished() const;
  // Waits (in real time) until the job finished; false on timeout.
  bool WaitFinished(std::chrono::milliseconds timeout);
  const JobConfig& config() const { return config_; }
  // A copy of the job as it is now (job_controller_snapshot.cc).
  JobSnapshot Snapshot() const;
  // Waits (in real time, without the controller's mutex) until every write
  // made so far is in the store; false on timeout. The daemon calls it before
  // it reads the store back and exits; tests before they read the store.
  bool FlushStore(std::chrono::milliseconds timeout);
  StoreWriter::Stats StoreStats() const { return writer_->stats(); }

 private:
  using Node = JobNode;  // node_registry.h

  void HandleRegister(std::uint64_t conn, const v1::Register& reg);
  // While resuming: takes back a node of the running generation that
  // reconnected with its ranks (true: welcomed). A node of it that came back
  // without them is lost (false: it registers as a new one).
  bool ResumeNode(std::uint64_t conn, const std::shared_ptr<AgentLink>& link, const v1::Register& reg,
                  v1::ControllerMessage* welcome);
  // Nodes of the running generation not back by the deadline are lost.
  void CheckResumeDeadline();
  // Every node of the resumed generation is back (`members` of them): the
  // job goes on; or, if none of them ever got the generation's Start, it is
  // started now; if only some did, the others are lost.
  void FinishResume(int members);
  // `owned`: the same message, whose statuses may be taken (null: copied).
  void HandleMessage(std::uint64_t conn, const v1::AgentMessage& msg, v1::AgentMessage* owned, Nanos arrived_mono);
  // The message to its handler (under the lock; the loop runs after it).
  void Dispatch(std::uint64_t conn, const v1::AgentMessage& msg, v1::AgentMessage* owned);
  void HandleHeartbeat(Node* node, const v1::Heartbeat& hb, v1::Heartbeat* owned);
  // A node's GPU reading (a heartbeat's, or its stop report's): errors that grew are said,
  // kept (gpu_errors: what corroborates a hardware verdict) and watched.
  void ObserveGpus(Node* node, std::vector<v1::GpuHealth> now);
  void HandleStarted(Node* node, const v1::RanksStarted& started, v1::RanksStarted* owned);
  void HandleRankExited(Node* node, const v1::RankExited& exited);
  // Keeps when a failed rank of this generation failed, for the incident's order of deaths.
  void NoteFailedAt(const v1::RankExited& exited);
  void HandleStopped(Node* node, const v1::Stopped& stopped);
  void HandleLogAlert(Node* node, const v1::LogAlert& alert);
  // What the ranks imported: idle spares make warm standbys of it (docs/restart.md).
  void HandleStandbyImports(Node* node, const v1::StandbyImports& imports);
  // The parts of a Start every node of the generation shares.
  void FillStart(v1::Start* start) const;
  // Step timings and clock echoes go to the telemetry ingest without the
  // lock (telemetry_ingest.h); the lock is taken only when it found
  // something. True: the message was telemetry.
  bool IngestTelemetry(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived_mono);
  // Takes the ingest's findings and acts on them (job_controller_timings.cc).
  void TakeTelemetry();
  // Probes every connected node's clock every clock_probe_interval.
  void ProbeClocks();
  // Records a straggler finding; with --straggler-action evict, fails the
  // generation so that the node is evicted (the "straggler" rule).
  void ActOnStraggler(const StragglerFinding& f);
  // The SDC monitor (sdc_monitor.h) judges what came in, when running;
  // what it decided is carried out in order (job_controller_sdc.cc).
  class SdcFacts;
  void CheckSdc(bool after_heartbeat);
  void CarryOutSdc(SdcActions actions);
  // Kept in the store per node (node actions sdc-confirmed / sdc-suspect).
  void RecordSdc(const SdcNodeRecord& record);
  void ReturnNode(const std::string& node, const std::string& why);
  // Records the generation's parallel layout (from the journals' groups) as
  // a "layout" event, for the trace to group ranks by.
  // Waits (returns without recording) while some rank's coordinates are
  // unknown, unless `final_try`.
  void RecordLayout(bool final_try);
  // `owned` (may be null): `status` itself, to be swapped in rather than copied.
  void UpdateRank(Node* node, const v1::RankStatus& status, v1::RankStatus* owned = nullptr);
  // The one loop (job_controller_reconcile.cc): takes the steps the
  // difference between the desired and the observed state calls for, until
  // none is left. Runs after every handler, Tick, Start and Resume.
  void Reconcile();
  // One step; true when it changed the state (the loop looks again).
  bool ReconcileStep();
  void MaybeStartGeneration();
  // Each node's Start, to send once the generation_started event is in the store.
  using Starts = std::vector<std::pair<std::shared_ptr<AgentLink>, v1::ControllerMessage>>;
  // Sends `starts` once `decided` is in the store, or after
  // config_.start_record_wait: off the lock (on starter_), unless the
  // runners are inline; not if the generation was stopped meanwhile.
  void SendWhenRecorded(StoreWriter::Ticket decided, Starts starts);
  // The nodes did not come within the rendezvous timeout: the job fails.
  void GiveUpWaiting();
  // With some of the job's group ranks empty (`empty`): whether the job may
  // start without them now (--nnodes MIN:MAX); says once why it waits.
  bool MayStartWithout(const std::vector<int>& empty);
  // Gives the nodes in `slots` (some null) the group ranks 0..k-1 in order.
  void RenumberGroupRanks(std::vector<Node*>* slots);
  int MinNodes() const { return config_.min_nnodes > 0 ? config_.min_nnodes : config_.nnodes; }
  // What the detectors look at now.
  JobView View() const;
  // The earliest hang deadline the ranks' reports left (NodeView::hang_deadline),
  // over the nodes View() holds: no hang can be found before it. O(nodes).
  Nanos EarliestHangDeadline() const;
  void CheckHeartbeats();
  // Takes each node's arrival stamp from its link (AgentLink::LastHeardMono)
  // and sets when the earliest could pass the silence limit; true if one
  // has passed it already.
  bool RefreshLiveness();
  // A gap between Ticks beyond watch_gap_grace: the controller did not run;
  // silence is counted from now (recorded as controller_stalled).
  void NoteWatchGap(Nanos now);
  void NodeLost(Node* node, const std::string& why, Nanos fault_wall);
  // Runs what the off-lock work finished (explain_, blame_).
  void TakeOffLockResults();
  // The backend's answer on a lost node: the node is replaced once
  // explained; the incident a loss opened takes its sentence and verdict,
  // and is decided only then (or after kExplainWait).
  void ApplyExplanation(const std::string& node_id, const LossExplanation& known);
  // Asks the scheduler backend, off the lock, what it knows of node `id`'s
  // loss; ApplyExplanation then asks it for a replacement.
  void ExplainAndReplace(const std::string& id, const std::string& why);
  // Opens an incident for `finding` and stops every rank.
  void Fail(const Finding& finding);
  void MaybeAllStopped();
  // Evicts what the verdict says, diagnoses the nodes (when on; the round
  // comes back here `diagnosed`) and restarts every rank.
  void Restart(const Verdict& verdict, bool diagnosed = false);
  // Orders a diagnosis round of every connected node (DIAGNOSING); when it is
  // done, failing nodes are evicted and the job goes on: a restart with
  // pending_verdict_, or the first start (job_controller_diagnosis.cc; the
  // round's logic: diagnosis_coordinator.h).
  // `only`: just these nodes (suspects), with the quick suite when the job diagnoses nothing routinely.
  void StartDiagnosis(DiagnosisPurpose why, const std::vector<std::string>& only = {});
  void SendDiagnosisOrders();
  void HandleDiagnostics(Node* node, const v1::DiagnosticsResult& result);
  // Carries out what the coordinator decided, in order.
  void CarryOutDiagnosis(DiagActions actions);
  // Link health from a heartbeat's counters: records flaps, silent links;
  // a flapping node fails the job's generation (or, idle, is evicted).
  void ObserveLinks(Node* node, const v1::NodeMetrics& metrics);
  void MaybeFinishDiagnosis();
  // Once every rank stopped: blames the incident off the lock (the rules
  // over every line, other jobs' history from the store), then Decide.
  void BlameOffLock();
  // Asks the policy what to do about the blamed incident; records the
  // blame and the decision with their evidence.
  Verdict Decide(const Blame& b, const FleetFinding& fleet);
  // After Decide: restarts, evicts or ends the job.
  void CarryOut(const Verdict& verdict);
  // What other jobs' incidents in the store say of this one (fleet_history.h).
  // Off the lock: reads the store and the writer only.
  FleetFinding ReadFleet(const Blame& blame);
  // Takes the node out of the job and cordons it in the store (no job gives
  // it ranks until an operator uncordons it), with `evidence` (a JSON object).
  void Evict(const std::string& node_id, const std::string& why, const std::string& evidence = "{}");
  // Closes the node's session, frees its group rank and tells the backend
  // (which may bring a node in its place; if not, the rank is given up).
  void RemoveFromJob(Node* node, const std::string& why);
  // Nodes that hold a group rank but were cordoned (by an operator) since.
  void EvictCordonedNodes();
  // Idle spares take the empty group ranks.
  void PromoteSpares();
  void Finish(JobState final_state, const std::string& summary);
  void SetState(JobState s, const std::string& why);
  void RecordDowntime(const RestartPath& path);
  // Records an event (in order, through the writer) and tells the listener.
  StoreWriter::Ticket Emit(EventKind kind, const std::string& node, int rank, std::int64_t step,
                           const std::string& message, const std::string& detail_json = "{}");
  // A node's health under the lock: a cordon still queued in the writer,
  // else the store's as last read (health_); Unavailable before any read.
  StatusOr<NodeHealth> HealthOf(const std::string& node_id);
  // The same off the lock, from the store itself (the blame's fleet reading).
  StatusOr<NodeHealth> StoredHealthOf(const std::string& node_id);
  // Reads every node's health off the lock into health_ (one at a time).
  void ReadHealthOffLock();
  // Reads the suspects' confirmed SDC history off the lock into health_
  // (SdcJob::SdcHistory).
  void ReadSdcHistoryOffLock(const std::vector<std::string>& nodes);
  std::int64_t MaxStep() const;
  // Checkpoint time of the current generation, the slowest rank's.
  double CheckpointOverheadMs() const;
  // Of it, the longest any rank's saves waited for the previous save's write.
  double CheckpointWaitMs() const;

  // How often the store's node health is read again (off the lock).
  // How long an incident opened by a lost node waits for the backend to say
  // why (bounded by the backend itself: Slurm's answers take up to 4 s).
  static constexpr Nanos kExplainWait = 10 * kSecond;

  const JobConfig config_;
  const RuleSet* const rules_;
  const std::string scan_rules_json_;  // rules_'s scan rules as a rule file, sent in every Welcome
  Clock* const clock_;
  EventStore* const store_;                   // reads
  const std::unique_ptr<StoreWriter> writer_;  // every write, off the mutex
  NodeProvider* provider_;  // guarded by mu_
  // Off the lock: lost nodes explained (a few at once), and incidents
  // blamed (a thread of their own: explanations that take seconds each
  // must not hold a decision up).
  std::unique_ptr<OffLockRunner> explain_;
  std::unique_ptr<OffLockRunner> blame_;
  // Sends a generation's Start once its record is in the store (its work
  // takes the lock itself).
  std::unique_ptr<OffLockRunner> starter_;
  int off_lock_threads_ = 4;  // SetOffLockThreads (0: inline)
  std::map<std::string, std::string> explaining_;  // lost node -> why, until its explanation is back
  std::string awaiting_explanation_;               // the lost node the open incident waits to hear of
  Nanos awaiting_since_mono_ = 0;
  EventListener* listener_ = nullptr;  // guarded by mu_
  NodeHealthCache health_;               // the store's node health as last read (guarded by mu_)
  bool health_reading_ = false;          // a read of it is under way
  Nanos next_health_read_mono_ = 0;

  mutable std::mutex mu_;
  std::atomic<bool> tick_waiting_{false};  // Tick wants mu_: OnMessage lets it go first
  std::condition_variable finished_cv_;
  JobState state_ = JobState::kStarting;
  NodeRegistry nodes_;  // registered nodes
  std::unordered_map<std::uint64_t, std::shared_ptr<AgentLink>> pending_links_;  // connected, not registered yet
  std::size_t stop_scan_hint_ = 0;  // MaybeAllStopped: the first node found still running
  int exited_ok_ranks_ = 0;  // ranks of the generation that exited 0 (a recount confirms "all")
  std::int64_t generation_ = -1;     // generation running or being stopped
  int active_nnodes_ = 0;            // the nodes of generation_ (fewer than nnodes after a shrink)
  // Group ranks nobody is expected to fill: evicted with no replacement
  // coming, or beyond the nodes left after a shrink. The job does not wait
  // elastic_wait for them.
  std::set<int> given_up_slots_;
  std::string waiting_said_;         // the last "waiting_for_nodes" message
  int restart_count_ = 0;
  Nanos waiting_since_mono_ = 0;     // start of STARTING / RESTARTING
  Nanos stop_sent_mono_ = 0;          // when the newest Stop went out (each node gets stop_timeout from it)
  v1::ControllerMessage stop_;        // the incident's Stop, for nodes that reconnect while it stops
  Nanos generation_start_wall_ = 0;
  bool first_step_seen_ = false;     // in the current generation
  // Its first step (wall time, number), for the live downtime report: the
  // first_step event may still be on its way to the store.
  Nanos first_step_wall_ = 0;
  std::int64_t first_step_no_ = -1;
  v1::ControllerMessage spare_standby_;  // PrepareStandby for idle spares; none before the first imports
  // Node memory copies (docs/restart.md): by group rank, the node that
  // held its ranks' copies in the generation before; empty after a resize
  // (the ranks' files are named by global rank).
  std::vector<std::string> memory_holders_;
  // Sets each node's memory_peer and memory_restore_from in its Start.
  void AssignMemoryPeers(const std::vector<Node*>& slots, v1::Start* start, const Node& node);
  std::optional<Incident> incident_;
  int incident_count_ = 0;
  std::int64_t checkpoint_step_ = -1;  // newest committed, across generations
  std::string last_failure_;
  int last_failure_status_ = 1;  // FailureExitStatus()
  RecoveryPolicy policy_;
  std::string summary_;
  std::atomic<std::int64_t> store_read_errors_{0};  // reads of the store that failed (writes: writer_->stats())
  int blaming_ = 0;  // the incident whose blame runs off the lock (0: none)
  bool started_ = false;
  std::vector<std::pair<std::uint64_t, v1::Register>> early_registrations_;  // before Start
  DiagnosisCoordinator diagnosis_;  // the diagnosis rounds (in DIAGNOSING)
  bool preflight_done_ = false;
  bool rediagnose_ = false;  // Resume: the incident's diagnosis round is run again before the restart
  Verdict pending_verdict_;                  // the restart a diagnosis round holds up
  LinkMonitor link_monitor_;
  Nanos next_clock_probe_mono_ = 0;
  Nanos last_tick_mono_ = 0;
  Nanos next_hang_check_mono_ = 0;
  bool reconcile_from_tick_ = false;  // Reconcile called by Tick (not by a message)
  Nanos next_wait_scan_mono_ = 0;     // MaybeStartGeneration from a Tick scans the nodes again no sooner
  Nanos next_silence_check_mono_ = 0;  // CheckHeartbeats need not look before  // DetectHang need not run before (hang_detector.h: HangDeadline)
  Nanos silence_from_mono_ = 0;  // JobView::silence_from_mono
  SdcMonitor sdc_;  // silent data corruption and numeric sentinels (docs/sdc.md)
  // Timings, clocks, stragglers, data waits, GPU series: a lock of its own.
  TelemetryIngest telemetry_;
  // The checkpoint plan told the ranks (docs/checkpoint_policy.md).
  CheckpointPolicy checkpoints_;
  std::int64_t plan_generation_ = -1;  // the generation whose nodes were sent the plan
  void MaybeSendCheckpointPlan();
  bool resuming_ = false;               // after Resume, until every node is back or the deadline
  Nanos resume_deadline_mono_ = 0;
  // Nodes of the resumed generation with no ranks_started recorded, and
  // those of them that came back without its ranks (its Start never went out).
  std::set<std::string> unstarted_;
  std::set<std::string> came_back_unstarted_;
  bool generation_recorded_ = false;  // the generation about to start is in the store already (Resume)
  JobState resumed_from_ = JobState::kStarting;
};

}  // namespace trainguard
