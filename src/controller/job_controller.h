// JobController: the per-job state machine, detectors and recovery policy.
//
//   STARTING --all nodes registered--> RUNNING --all ranks exit 0--> SUCCEEDED
//   RUNNING --rank failed | hang | node lost--> STOPPING --all stopped-->
//   RESTARTING --all nodes present--> RUNNING ...   (restart count + 1 each time)
//   STOPPING --restart count would exceed max_restarts--> FAILED
//
// It knows nothing of sockets or processes: a transport feeds it agent
// messages and connection events and hands it an AgentLink per connection; a
// NodeProvider (the scheduler backend) replaces lost nodes; time comes from an
// injected Clock and deadlines are checked in Tick(), which the daemon calls
// periodically (every 50 ms) and tests call after advancing a FakeClock.
// Every decision is appended to the EventStore with its evidence.
//
// Thread safety: all public methods may be called from any thread; one mutex
// serializes them. AgentLink::Send and NodeProvider::ReplaceNode are called
// with that mutex held and must not block or call back into the controller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attribution/attribution.h"
#include "common/clock.h"
#include "proto/protocol.h"
#include "store/event_store.h"

namespace trainguard {

// Tunables of one job. Worst-case detection times that follow from them are
// in docs/detection.md.
struct JobConfig {
  std::string job_id;
  int nnodes = 1;
  int nproc_per_node = 1;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // extra environment for every rank
  // Restarts allowed after the first launch; the job fails on the failure after that.
  int max_restarts = 3;
  // How often agents send a heartbeat.
  Nanos heartbeat_interval = 1 * kSecond;
  // A node is lost after this many heartbeat intervals without one.
  int missed_heartbeats = 5;
  // A rank whose step has not advanced for this long is hung.
  Nanos hang_timeout = 300 * kSecond;
  // Allowance before a rank's first step (imports, data loading, rendezvous).
  Nanos startup_timeout = 600 * kSecond;
  // SIGTERM to SIGKILL when agents stop ranks.
  Nanos stop_grace = 5 * kSecond;
  // How long agents get to report their ranks stopped before they count as lost.
  Nanos stop_timeout = 30 * kSecond;
  // How long the job waits for all nodes to (re)join before it fails.
  Nanos rendezvous_timeout = 300 * kSecond;
  // Restart-storm guard: stop after this many incidents in a row in which
  // the job made no step beyond the previous failure.
  int no_progress_restarts = 3;
};

enum class JobState { kStarting, kRunning, kStopping, kRestarting, kSucceeded, kFailed };
const char* JobStateName(JobState s);

// One connected agent, as the controller sees it. Send must not block.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  virtual void Send(const v1::ControllerMessage& msg) = 0;
  // Ends the session; the transport reports OnDisconnect afterwards.
  virtual void Close() = 0;
};

// Scheduler backend: what is done about a node that was lost.
class NodeProvider {
 public:
  virtual ~NodeProvider() = default;
  // Evicts `node_id` (kills what is left of it) and brings a replacement that
  // will register, under the same or another node id. Must not block.
  virtual void ReplaceNode(const std::string& node_id, const std::string& reason) = 0;
};

class JobController {
 public:
  // `store` and `clock` must outlive the controller; `provider` may be null
  // (lost nodes are then waited for until rendezvous_timeout). `rules` may be
  // null: incidents are then not attributed and every failure is restarted.
  JobController(JobConfig config, Clock* clock, EventStore* store, NodeProvider* provider,
                const RuleSet* rules = nullptr);

  // Replaces the node provider (null: none). Takes effect for the next loss.
  void SetNodeProvider(NodeProvider* provider);

  // Records the job in the store. Call once before anything else.
  Status Start();

  void OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink> link);
  void OnMessage(std::uint64_t conn, const v1::AgentMessage& msg);
  void OnDisconnect(std::uint64_t conn);
  void Tick();
  // Stops every rank and fails the job (user interrupt).
  void Cancel(const std::string& reason);

  JobState state() const;
  int restart_count() const;
  std::string summary() const;
  bool finished() const;
  // Waits (in real time) until the job finished; false on timeout.
  bool WaitFinished(std::chrono::milliseconds timeout);
  const JobConfig& config() const { return config_; }

 private:
  struct RankView {
    v1::RankStatus status;
    Nanos received_mono = 0;
    bool exited_ok = false;
  };
  struct Node {
    std::string node_id;
    std::uint64_t conn = 0;  // 0: not connected
    std::shared_ptr<AgentLink> link;
    int group_rank = -1;     // -1: holds no slot
    std::string address;
    int free_port = 0;
    Nanos last_heartbeat_mono = 0;
    Nanos last_heartbeat_wall = 0;
    std::int64_t stopped_generation = -1;
    std::map<int, RankView> ranks;  // by global rank, current generation
  };
  // The failure being recovered from; its downtime is recorded when the next
  // generation makes its first step.
  struct Incident {
    int number = 0;
    std::string kind;
    std::string description;
    Nanos fault_wall = 0;
    Nanos detected_wall = 0;
    Nanos detected_mono = 0;
    Nanos stopped_wall = 0;
    std::int64_t failure_step = -1;
    std::int64_t checkpoint_step = -1;
    std::int64_t generation = -1;
    Nanos last_step_wall = 0;         // newest step of any rank before the fault
    int first_rank = -1;              // the rank whose failure was seen first
    std::string first_node;
    std::int64_t first_rank_step = -1;
    std::vector<int> hung_ranks;
    std::vector<LogLine> lines;       // what the attribution reads
    std::map<int, std::pair<std::string, std::string>> stacks;  // rank -> (state, python)
    std::map<int, std::int64_t> rank_steps;  // last step of each rank, as reported at the end
    std::map<int, Nanos> exit_times;         // ranks that failed on their own: when
  };
  enum class Decision { kRestart, kEvict, kStop };

  Node* NodeByConn(std::uint64_t conn);
  Node* NodeById(const std::string& id);
  void HandleRegister(std::uint64_t conn, const v1::Register& reg);
  void HandleHeartbeat(Node* node, const v1::Heartbeat& hb);
  void HandleStarted(Node* node, const v1::RanksStarted& started);
  void HandleRankExited(Node* node, const v1::RankExited& exited);
  void HandleStopped(Node* node, const v1::Stopped& stopped);
  void UpdateRank(Node* node, const v1::RankStatus& status);
  void MaybeStartGeneration();
  void CheckHeartbeats(Nanos now);
  void CheckHangs(Nanos now);
  void NodeLost(Node* node, const std::string& why, Nanos fault_wall);
  void Fail(const std::string& kind, const std::string& description, const std::string& node,
            int rank, Nanos fault_wall, const std::vector<int>& capture_stacks_of,
            const std::string& detail_json);
  void MaybeAllStopped();
  // Attributes the incident being recovered from and decides what to do;
  // records both with their evidence. Sets *why to a one-line reason.
  Decision Decide(std::vector<std::string>* evict_nodes, std::string* why);
  void Evict(const std::string& node_id, const std::string& why);
  std::string NodeOfRank(int rank) const;
  void Finish(JobState final_state, const std::string& summary);
  void SetState(JobState s, const std::string& why);
  void RecordDowntime(Nanos first_step_wall);
  void Emit(const std::string& kind, const std::string& node, int rank, std::int64_t step,
            const std::string& message, const std::string& detail_json = "{}");
  std::int64_t MaxStep() const;
  // Checkpoint time of the current generation, the slowest rank's.
  std::int64_t CheckpointOverheadMs() const;

  const JobConfig config_;
  const RuleSet* const rules_;
  Clock* const clock_;
  EventStore* const store_;
  NodeProvider* provider_;  // guarded by mu_

  mutable std::mutex mu_;
  std::condition_variable finished_cv_;
  JobState state_ = JobState::kStarting;
  std::vector<Node> nodes_;
  std::int64_t generation_ = -1;     // generation running or being stopped
  int restart_count_ = 0;
  Nanos waiting_since_mono_ = 0;     // start of STARTING / RESTARTING
  Nanos stop_sent_mono_ = 0;
  Nanos generation_start_wall_ = 0;
  bool first_step_seen_ = false;     // in the current generation
  std::optional<Incident> incident_;
  int incident_count_ = 0;
  std::int64_t checkpoint_step_ = -1;  // newest committed, across generations
  std::string last_failure_;
  std::vector<std::string> signatures_;   // category|rule|rank|step of each incident
  std::int64_t best_failure_step_ = -1;   // highest step any incident failed at
  int no_progress_incidents_ = 0;
  std::string summary_;
  std::int64_t store_errors_ = 0;
};

}  // namespace trainguard
