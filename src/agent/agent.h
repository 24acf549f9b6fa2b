// Agent: the per-node executor. Registers with the controller, spawns the
// node's ranks with the torchrun environment, watches them (exit status,
// status pages, output), sends heartbeats, stops ranks on command (capturing
// stacks first when asked) and never leaves a process behind.
//
// Threading: Run() is the control loop and the only thread that spawns,
// signals and reaps ranks (see process.h on PDEATHSIG). OnCommand() and
// OnLinkLost() may be called from any thread (the transport's); they queue
// work for the control loop. One output thread per rank copies its stdout and
// stderr to the rank's two log files and, prefixed, to this process's stdout
// and stderr (OutputPump).
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
#include <tuple>
#include <string>
#include <thread>
#include <vector>

#include "agent/cpu_pressure.h"
#include "agent/link_stats.h"
#include "agent/gpu_telemetry.h"
#include "agent/mount_io.h"
#include "agent/kernel_log.h"
#include "agent/process.h"
#include "attribution/attribution.h"
#include "common/clock.h"
#include "diag/net_probe.h"
#include "proto/protocol.h"

namespace trainguard {

struct StatusPage;

struct AgentConfig {
  std::string node_id;
  std::string hostname;
  std::string address = "127.0.0.1";  // MASTER_ADDR when this node holds group rank 0
  std::string run_dir;                // logs/, stacks/ and errors/ go below it
  std::string shm_dir = "/dev/shm";   // status pages
  std::string python_dir;             // prepended to PYTHONPATH ("" = none); the collective probe is there
  std::string rack;                   // the node's rack (top-of-rack switch), "" = none given
  std::string job_secret;             // shown when registering ("" = none)
  // After losing its controller, how long the agent keeps its ranks running
  // and tries to reconnect (a restarted controller takes them back); 0: it
  // stops its ranks and exits at once.
  Nanos reconnect_window = 60 * kSecond;
  bool stream_output = true;          // copy rank output to stdout/stderr with a "[rankN]: " prefix
  bool native_stacks = false;         // also capture gdb backtraces of hung ranks
  Nanos stack_timeout = 3 * kSecond;  // per rank, for the Python dump
  int log_tail_lines = 20;
  int preferred_group_rank = -1;      // -1: whichever slot the controller gives
  std::uint32_t protocol_version = kProtocolVersion;  // only tests change it
  std::string kernel_log = "/dev/kmsg";  // "" = do not read kernel messages
  // Rules scanned on every output and kernel line as it arrives (their
  // `scan` severity); null = no scanning.
  std::shared_ptr<const RuleSet> scan_rules;
};

// How the agent sends to the controller. Send must not block for long;
// it returns false when the session is gone.
class ControllerLink {
 public:
  virtual ~ControllerLink() = default;
  virtual bool Send(const v1::AgentMessage& msg) = 0;
  // After the session was lost: opens a new one with the same controller
  // address, waiting at most `timeout`. Its messages go where the old
  // session's went. False if it could not (a link that cannot reconnect
  // always says false).
  virtual bool Reconnect(Nanos timeout) { return false; }
  // Gives the session up as lost (its controller fell silent, or was
  // deposed: a newer leader exists) and makes the next Reconnect try the
  // next controller address first. The loss is reported as any other.
  virtual void Abandon(const std::string& why) { (void)why; }
};

class Agent {
 public:
  Agent(AgentConfig config, Clock* clock, ControllerLink* link);
  ~Agent();

  void OnCommand(const v1::ControllerMessage& msg);
  void OnLinkLost(const std::string& why);
  // Ends Run (a signal): the ranks are stopped, no reconnecting.
  void Interrupt(const std::string& why);

  // Registers and runs until the controller says Shutdown (returns 0) or
  // refuses us / the session is lost (returns 1; error() says why). All ranks
  // are stopped and reaped before it returns.
  int Run();
  std::string error() const;
  // After Run() returned 0: the job's exit status from the Shutdown (0 when
  // it succeeded), what `trainguard run` on an agent-only host exits with.
  int job_exit_status() const;

  // Test hooks.
  std::vector<int> RankPids() const;

 private:
  struct Rank;
  struct Command {
    std::optional<v1::ControllerMessage> msg;
    std::string link_lost;     // non-empty: the session ended
    bool reconnected = false;  // a new session is open (no msg)
    bool gave_up = false;      // the reconnect window passed (with link_lost)
  };

  struct Alert {
    std::int64_t generation;
    int rank;              // -1: kernel log
    const Rule* rule;
    std::string line;
    Nanos wall;
  };
  // Matches `line` against the scan rules; a match is queued as an alert
  // (once per generation, rank and rule). Any thread.
  void ScanLine(std::int64_t generation, int rank, const std::string& line);
  // Reads new kernel lines and scans them. Control loop only.
  void PollKernel();
  void SendAlerts();

  void StartRanks(const v1::Start& start);
  // Makes `rank` run as `proc` (or reports that it could not start), and
  // adds it to the Started message being gathered.
  void LaunchRank(std::unique_ptr<Rank> rank, StatusOr<SpawnedProcess> proc, const std::string& log_base);
  // Sends the start's Started message once no rank of it awaits its standby.
  void MaybeSendStarted();
  // The controller's checkpoint plan into a rank's page (nothing with no page).
  void WriteCheckpointPlan(StatusPage* page) const;
  // The environment every rank of `start` shares (torchrun's variables and
  // trainguard's), before the per-rank ones.
  std::map<std::string, std::string> RanksEnvironment(const v1::Start& start) const;
  // Node memory copies of checkpoints (agent_memory.cc, docs/restart.md).
  struct MemoryCopies;
  void StartMemoryServer();
  int MemoryPort() const;  // 0: no server
  // The root of this node's copies for `start`'s ranks ("" = none), made on first use.
  std::string MemoryRoot(const v1::Start& start) const;
  // Where to push this generation's copies; fetches this node's ranks'
  // copies from the peer that held them when its memory has none.
  void PrepareMemoryCopies(const v1::Start& start, v1::RanksStarted* started);
  // Queues the copies of newly committed steps for the peer (each loop turn).
  void MaybePushMemoryCopies();
  std::int64_t MemoryCopyBytes() const;
  // Removes them (the job ended here).
  void DropMemoryCheckpoints();
  // Warm standbys (agent_standby.cc): made after this node's first step of
  // a generation; a start takes them (or says why it starts a rank cold).
  struct WarmState;
  void PrepareWarm(const v1::Start& start, bool instrument);
  void MaybeMakeStandbys();
  // Takes `rank` into the awaited ones if its standby is still importing
  // (it is hurried); false: start it now.
  bool AwaitStandby(std::unique_ptr<Rank>& rank, SpawnSpec& spec, const std::string& log_base);
  // Starts each awaited rank whose standby got ready, went, or stalled (each loop turn).
  void AwaitStandbys();
  // The ranks are stopping or gone: standbys still importing import at their priority.
  void HurryStandbys();
  // How long a cold start of `local` took to its imports' end; learnt from a cold rank's page.
  void LearnColdImports(const Rank& rank);
  // The rank's process from its standby, or nullopt with `why` set.
  std::optional<SpawnedProcess> StartWarm(int local_rank, const std::vector<std::string>& argv,
                                          const std::map<std::string, std::string>& env, std::string* why);
  void DropStandbys();
  // An idle spare's standbys, from the running generation's command and
  // the modules its ranks imported (PrepareStandby).
  void PrepareSpareStandbys(const v1::PrepareStandby& order);
  // Tells the controller what the ranks imported (group rank 0 only), for spares.
  void SendImports(const std::string& imports);
  std::string ImportsFile(int local_rank) const;
  void StopRanks(std::int64_t generation, const std::vector<int>& capture,
                 Nanos grace, bool report);
  void ReapExited();
  void SendHeartbeat();
  // Drains every running rank's timing ring and journal (each loop turn).
  void PollTimings();
  // Sends the steps that finished (`flush`: also the newest, held back to
  // wait for its device times) as one Timings message, if there are any.
  void SendTimings(bool flush);
  // Runs the diagnostics suite on a thread of its own (heartbeats go on) and
  // answers when it is done; one round at a time. Control loop only.
  void StartDiagnostics(const v1::RunDiagnostics& order);
  void MaybeSendDiagnostics();
  v1::RankStatus Describe(const Rank& rank) const;
  // Every process of this generation's ranks seen so far.
  std::set<int> RankProcesses() const;
  // The node's recent kernel lines, without OOM-killer reports about
  // processes outside `ours`, at most kKernelLines.
  std::vector<std::string> KernelLines(const std::set<int>& ours) const;
  void Send(const v1::AgentMessage& msg);
  int RunLoop();
  // The Register message; with `resume`, it asks to keep the running ranks.
  v1::AgentMessage MakeRegister(bool resume);
  // The session was lost: keep the ranks and reconnect on a thread of its
  // own (a Command says how it went). False if the agent must not wait.
  bool StartReconnecting(const std::string& why);

  const AgentConfig config_;
  Clock* const clock_;
  ControllerLink* const link_;

  mutable std::mutex mu_;  // guards commands_, error_, pids_, alerts_, alerted_
  std::condition_variable cv_;
  std::deque<Command> commands_;
  std::string error_;
  std::vector<int> pids_;
  int job_exit_status_ = 0;
  // While the controller is away: what must reach it once back (rank exits,
  // stops, starts, alerts, diagnostics), oldest first, at most kOutboxSize.
  bool away_ = false;
  // The controller's silence that counts as its loss (Welcome.silence_ms;
  // 0: none), and when it was last heard (monotonic).
  Nanos controller_silence_ = 0;
  std::atomic<Nanos> last_heard_mono_{0};
  // The highest controller lead seen (ControllerMessage.lead_epoch): a
  // deposed leader's messages are not acted on.
  std::atomic<std::int64_t> highest_epoch_{0};
  std::deque<v1::AgentMessage> outbox_;
  std::thread reconnector_;
  std::atomic<bool> quitting_{false};
  // Replaces scan_rules_ with the scan rules the controller sent in its Welcome.
  void UseControllerScanRules(const std::string& rule_file);
  std::shared_ptr<const RuleSet> scan_rules_;  // ScanRules() of config_.scan_rules, or the controller's
  std::vector<Alert> alerts_;
  std::set<std::tuple<std::int64_t, int, std::string>> alerted_;  // (generation, rank, rule id)

  // Control-loop state (Run() thread only).
  KernelLog kernel_;
  void ReadSaveLedger(const Rank& rank, v1::RankStatus* s) const;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // The running start's Started message while ranks of it await their standbys.
  std::optional<v1::AgentMessage> pending_started_;
  std::int64_t verified_step_ = -1;  // the controller's newest (Verified), for new ranks' pages too
  std::string checkpoint_plan_;      // the controller's last CheckpointPlan, as its basis line
  std::int64_t plan_memory_ms_ = 0;  // its intervals, for new ranks' pages too (0: none yet)
  std::int64_t plan_storage_ms_ = 0;
  std::unique_ptr<WarmState> warm_;
  std::unique_ptr<MemoryCopies> memory_;
  std::int64_t generation_ = -1;
  int group_rank_ = -1;  // of the running generation
  Nanos heartbeat_interval_ = 1 * kSecond;
  Nanos next_heartbeat_ = 0;
  struct DiagnosticsRun;
  std::shared_ptr<DiagnosticsRun> diagnostics_;  // the round running, if any
  std::unique_ptr<GpuTelemetry> gpus_;            // started with the first heartbeat
  std::unique_ptr<GpfsSampler> gpfs_;             // started with the first heartbeat
  CpuPressure cpu_pressure_;                      // the ranks' CPU quota throttling, steal
  TcpSegments tcp_last_;                          // the previous heartbeat's TCP counters
  std::unique_ptr<PeerServer> peer_server_;       // the other end of the neighbours' network probes
};

}  // namespace trainguard
