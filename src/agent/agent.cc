#include "agent/agent.h"
#include "agent/timing_collector.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <thread>

#include "agent/error_file.h"
#include "agent/journal_status.h"
#include "agent/link_stats.h"
#include "agent/output_pump.h"
#include "agent/process.h"
#include "common/status_page.h"
#include "diag/collective_probe.h"
#include "diag/suite.h"
#include "proto/sanitize.h"

namespace trainguard {

namespace fs = std::filesystem;

// Written by the Python module's init() at the top of the stacks file once
// faulthandler is registered for SIGUSR1; without it SIGUSR1 would kill the rank.
constexpr const char* kStacksReadyMarker = "trainguard-stacks-ready";

namespace {

off_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

std::string ReadFrom(const std::string& path, off_t offset) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(offset);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string RunCapture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0 && out.size() < (1 << 20)) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

struct Agent::Rank {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  Nanos launch_mono = 0;
  MappedStatusPage page;
  std::string stacks_path;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  std::unique_ptr<OutputPump> output;
  std::set<int> pids;      // the rank and every process seen in its group
  bool running = false;
  ExitInfo exit;
  ActivityTracker activity{0};
  TimingCollector timings;  // this rank's per-step timings, from its page
};

// Kernel messages older than this are not sent with a failure.
constexpr Nanos kKernelWindow = 10 * 60 * kSecond;
constexpr size_t kKernelLines = 50;       // sent with a failure
constexpr size_t kKernelLinesRead = 500;  // looked through for them

Agent::Agent(AgentConfig config, Clock* clock, ControllerLink* link)
    : config_(std::move(config)), clock_(clock), link_(link),
      kernel_(config_.kernel_log.empty() ? "/nonexistent" : config_.kernel_log) {
  if (config_.scan_rules != nullptr) {
    auto scan = std::make_shared<RuleSet>(config_.scan_rules->ScanRules());
    if (!scan->rules().empty()) scan_rules_ = scan;
  }
}

void Agent::UseControllerScanRules(const std::string& rule_file) {
  if (rule_file.empty()) return;  // an older controller: keep the shipped rules
  auto rules = RuleSet::Parse(rule_file, "the controller's scan rules");
  if (!rules.ok()) {
    // Keep scanning with the shipped rules rather than not at all.
    std::fprintf(stderr, "trainguard agent %s: warning: %s\n", config_.node_id.c_str(),
                 rules.status().message().c_str());
    return;
  }
  // Called on the agent's own thread when the Welcome arrives, before any
  // Start: no output pump (the other reader of scan_rules_) exists yet.
  auto scan = std::make_shared<RuleSet>(rules->ScanRules());
  scan_rules_ = scan->rules().empty() ? nullptr : scan;
}

void Agent::ScanLine(std::int64_t generation, int rank, const std::string& line) {
  if (scan_rules_ == nullptr) return;
  for (int i : scan_rules_->Match(line)) {
    const Rule& rule = scan_rules_->rules()[i];
    std::lock_guard<std::mutex> lock(mu_);
    if (!alerted_.emplace(generation, rank, rule.id).second) continue;
    alerts_.push_back(Alert{generation, rank, &rule, line.substr(0, 2000), WallNowNanos()});
    cv_.notify_all();
  }
}

void Agent::PollKernel() {
  for (const auto& line : kernel_.Poll()) ScanLine(generation_, -1, line);
}

void Agent::SendAlerts() {
  std::vector<Alert> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(alerts_);
  }
  for (const Alert& a : batch) {
    v1::AgentMessage m;
    v1::LogAlert* alert = m.mutable_log_alert();
    alert->set_generation(a.generation);
    alert->set_global_rank(a.rank);
    alert->set_rule_id(a.rule->id);
    alert->set_severity(a.rule->scan);
    alert->set_line(a.line);
    alert->set_seen_unix_ms(a.wall / kMillisecond);
    Send(m);
  }
}

Agent::~Agent() {
  quitting_ = true;
  if (reconnector_.joinable()) reconnector_.join();
  StopRanks(generation_, {}, 0, false);
}

void Agent::OnCommand(const v1::ControllerMessage& msg) {
  if (msg.has_clock_probe()) {
    // Answered here, on the transport's thread, so that the round trip the
    // controller measures is the network's and not the control loop's.
    v1::AgentMessage echo;
    echo.mutable_clock_echo()->set_controller_unix_us(msg.clock_probe().controller_unix_us());
    echo.mutable_clock_echo()->set_agent_unix_us(clock_->WallNanos() / 1000);
    link_->Send(echo);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  commands_.push_back(Command{msg, ""});
  cv_.notify_all();
}

void Agent::OnLinkLost(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  commands_.push_back(Command{std::nullopt, why.empty() ? "session ended" : why});
  cv_.notify_all();
}

std::string Agent::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int Agent::job_exit_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_exit_status_;
}

std::vector<int> Agent::RankPids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pids_;
}

void Agent::Interrupt(const std::string& why) {
  quitting_ = true;
  OnLinkLost(why);
}

int Agent::Run() {
  int rc = RunLoop();
  quitting_ = true;
  if (reconnector_.joinable()) reconnector_.join();
  return rc;
}

int Agent::RunLoop() {
  std::error_code ec;
  fs::create_directories(config_.run_dir + "/logs", ec);
  fs::create_directories(config_.run_dir + "/stacks", ec);
  fs::create_directories(config_.run_dir + "/errors", ec);
  if (ec) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = "cannot create run directory " + config_.run_dir + ": " + ec.message();
    return 1;
  }
  peer_server_ = std::make_unique<PeerServer>();
  if (Status s = peer_server_->Start(config_.address); !s.ok()) {
    std::fprintf(stderr, "trainguard agent: warning: %s; this node's network is not probed\n", s.message().c_str());
  }
  Send(MakeRegister(false));

  bool welcomed = false;
  for (;;) {
    std::deque<Command> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(20),
                   [&] { return !commands_.empty() || !alerts_.empty(); });
      batch.swap(commands_);
    }
    for (auto& cmd : batch) {
      if (cmd.reconnected) {
        // Register again, asking to keep the ranks, then what the
        // controller missed, in order.
        std::deque<v1::AgentMessage> missed;
        {
          std::lock_guard<std::mutex> lock(mu_);
          away_ = false;
          missed.swap(outbox_);
        }
        std::fprintf(stderr, "trainguard agent %s: reconnected to the controller\n", config_.node_id.c_str());
        Send(MakeRegister(true));
        for (const auto& m : missed) Send(m);
        next_heartbeat_ = 0;
        continue;
      }
      if (!cmd.msg) {
        // A controller that goes away may come back (restarted on the same
        // address): the ranks keep running meanwhile.
        if (welcomed && !cmd.gave_up && StartReconnecting(cmd.link_lost)) continue;
        StopRanks(generation_, {}, 0, false);
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.empty()) error_ = "lost the controller: " + cmd.link_lost;
        return 1;
      }
      const v1::ControllerMessage& m = *cmd.msg;
      if (m.has_welcome()) {
        if (!m.welcome().error().empty()) {
          StopRanks(generation_, {}, 0, false);
          std::lock_guard<std::mutex> lock(mu_);
          error_ = "controller refused registration: " + m.welcome().error();
          return 1;
        }
        // A controller that does not continue our generation: its ranks
        // are stale, and a Start will come when they are wanted.
        if (!m.welcome().resumed() && !ranks_.empty()) StopRanks(generation_, {}, 0, false);
        welcomed = true;
        UseControllerScanRules(m.welcome().scan_rules());
        if (m.welcome().heartbeat_interval_ms() > 0) {
          heartbeat_interval_ = m.welcome().heartbeat_interval_ms() * kMillisecond;
        }
      } else if (m.has_start() && welcomed) {
        StopRanks(generation_, {}, 0, false);  // a start while ranks run replaces them
        StartRanks(m.start());
        next_heartbeat_ = 0;
      } else if (m.has_stop()) {
        std::vector<int> capture(m.stop().capture_stacks_of().begin(),
                                 m.stop().capture_stacks_of().end());
        StopRanks(m.stop().generation(), capture, m.stop().grace_ms() * kMillisecond, true);
      } else if (m.has_run_diagnostics() && welcomed) {
        StartDiagnostics(m.run_diagnostics());
      } else if (m.has_shutdown()) {
        if (m.shutdown().reason().rfind("evicted", 0) == 0) {
          std::fprintf(stderr, "trainguard agent %s: %s\n", config_.node_id.c_str(), m.shutdown().reason().c_str());
        }
        StopRanks(generation_, {}, 0, false);
        std::lock_guard<std::mutex> lock(mu_);
        job_exit_status_ = m.shutdown().exit_status();
        return 0;
      }
    }
    PollKernel();
    if (welcomed) SendAlerts();
    MaybeSendDiagnostics();
    PollTimings();
    ReapExited();
    if (welcomed && clock_->MonotonicNanos() >= next_heartbeat_) {
      SendTimings(false);
      SendHeartbeat();
      next_heartbeat_ = clock_->MonotonicNanos() + heartbeat_interval_;
    }
  }
}

struct Agent::DiagnosticsRun {
  std::int64_t round = 0;
  bool collective = false;
  Nanos started_mono = 0;
  std::atomic<bool> done{false};
  std::vector<Figure> figures;  // written before done is set
};

void Agent::StartDiagnostics(const v1::RunDiagnostics& order) {
  if (diagnostics_ != nullptr) return;  // one round at a time; the controller waits for it
  auto run = std::make_shared<DiagnosticsRun>();
  run->round = order.round();
  run->collective = order.collective();
  run->started_mono = clock_->MonotonicNanos();
  diagnostics_ = run;
  if (order.collective()) {
    CollectivePlan plan;
    plan.python = !order.python().empty() ? order.python()
                  : std::getenv("TRAINGUARD_PYTHON") != nullptr ? std::getenv("TRAINGUARD_PYTHON")
                                                                 : "python3";
    plan.script = config_.python_dir.empty() ? "" : config_.python_dir + "/trainguard/_collective_probe.py";
    plan.work_dir = config_.run_dir;
    plan.local_ranks = order.local_ranks();
    plan.gpu = order.gpu();
    plan.nccl = order.nccl();
    plan.rack_rank = order.rack_rank();
    plan.rack_size = order.rack_size();
    plan.rack_master = order.rack_master();
    if (order.mode() == "full") {
      plan.bytes = 64ll << 20;
      plan.iters = 20;
    }
    std::thread([run, plan] {
      run->figures = RunCollectiveProbe(plan);
      run->done.store(true);
    }).detach();
    return;
  }
  SuitePlan plan;
  plan.mode = order.mode() == "full" ? "full" : "quick";
  for (const auto& p : order.paths()) {
    auto eq = p.find('=');
    if (eq != std::string::npos && eq > 0) plan.paths.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  if (plan.paths.empty()) plan.paths.emplace_back("scratch", config_.run_dir);
  plan.peers.assign(order.peers().begin(), order.peers().end());
  // Detached: a probe stuck in the kernel (a dead file system) must not
  // hold up the agent's exit; the controller times the round out.
  std::thread([run, plan] {
    run->figures = RunSuite(plan);
    run->done.store(true);
  }).detach();
}

void Agent::MaybeSendDiagnostics() {
  if (diagnostics_ == nullptr || !diagnostics_->done.load()) return;
  v1::AgentMessage m;
  v1::DiagnosticsResult* result = m.mutable_diagnostics();
  result->set_round(diagnostics_->round);
  result->set_figures_json(FiguresToJson(diagnostics_->figures));
  result->set_wall_ms((clock_->MonotonicNanos() - diagnostics_->started_mono) / kMillisecond);
  result->set_collective(diagnostics_->collective);
  if (diagnostics_->collective) result->set_free_port(FindFreePort());  // its old one may have served the rack
  diagnostics_.reset();
  Send(m);
}

void Agent::StartRanks(const v1::Start& start) {
  generation_ = start.generation();
  group_rank_ = start.group_rank();
  std::map<std::string, std::string> base = CurrentEnvironment();
  for (const auto& [k, v] : start.env()) base[k] = v;
  base["WORLD_SIZE"] = std::to_string(start.world_size());
  base["LOCAL_WORLD_SIZE"] = std::to_string(start.nproc_per_node());
  base["GROUP_RANK"] = std::to_string(start.group_rank());
  base["GROUP_WORLD_SIZE"] = std::to_string(start.nnodes());
  base["ROLE_NAME"] = "default";
  base["ROLE_WORLD_SIZE"] = std::to_string(start.world_size());
  base["MASTER_ADDR"] = start.master_addr();
  base["MASTER_PORT"] = std::to_string(start.master_port());
  base["TORCHELASTIC_RESTART_COUNT"] = std::to_string(start.generation());
  base["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(start.max_restarts());
  base["TORCHELASTIC_RUN_ID"] = start.run_id();
  base["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  if (!base.count("NCCL_ASYNC_ERROR_HANDLING")) base["NCCL_ASYNC_ERROR_HANDLING"] = "1";  // as torchrun
  if (!base.count("OMP_NUM_THREADS") && start.nproc_per_node() > 1) base["OMP_NUM_THREADS"] = "1";
  const bool instrument = !start.no_instrument();
  if (instrument) {
    base["TRAINGUARD_NODE_ID"] = config_.node_id;
    base["TRAINGUARD_JOB_ID"] = start.run_id();
    if (!base.count("PYTHONUNBUFFERED")) base["PYTHONUNBUFFERED"] = "1";
  }
  if (instrument && !config_.python_dir.empty()) {
    auto it = base.find("PYTHONPATH");
    base["PYTHONPATH"] = config_.python_dir +
                         (it != base.end() && !it->second.empty() ? ":" + it->second : "");
  }

  v1::AgentMessage started;
  started.mutable_started()->set_generation(generation_);
  for (int local = 0; local < start.nproc_per_node(); ++local) {
    auto rank = std::make_unique<Rank>();
    rank->local_rank = local;
    rank->global_rank = start.group_rank() * start.nproc_per_node() + local;
    std::string tag = start.run_id() + "-" + config_.node_id + "-r" +
                      std::to_string(rank->global_rank);
    std::string page_path = config_.shm_dir + "/trainguard-" + tag;
    auto page = MappedStatusPage::Create(page_path);
    std::string rank_gen = "rank" + std::to_string(rank->global_rank) + ".gen" +
                           std::to_string(generation_);
    std::string log_base = config_.run_dir + "/logs/rank" + std::to_string(rank->global_rank);
    rank->stacks_path = config_.run_dir + "/stacks/" + rank_gen + ".txt";
    std::ofstream(rank->stacks_path, std::ios::trunc).close();
    // A fresh error file per generation: one left by an earlier attempt must
    // never be read as this one's.
    rank->error_file = config_.run_dir + "/errors/" + rank_gen + ".json";
    unlink(rank->error_file.c_str());
    for (const char* stream : {".stdout.log", ".stderr.log"}) {
      std::ofstream log(log_base + stream, std::ios::app);
      log << "==== trainguard: generation " << generation_ << " of job " << start.run_id()
          << " ====\n";
    }
    std::map<std::string, std::string> env = base;
    env["TORCHELASTIC_ERROR_FILE"] = rank->error_file;
    env["RANK"] = std::to_string(rank->global_rank);
    env["LOCAL_RANK"] = std::to_string(local);
    env["ROLE_RANK"] = std::to_string(rank->global_rank);
    if (instrument) env["TRAINGUARD_STACKS_FILE"] = rank->stacks_path;
    if (page.ok()) {
      rank->page = std::move(page.value());
      if (instrument) env["TRAINGUARD_STATUS_PAGE"] = page_path;
    } else {
      std::fprintf(stderr, "trainguard agent %s: rank %d runs without a status page: %s\n",
                   config_.node_id.c_str(), rank->global_rank, page.status().ToString().c_str());
    }
    SpawnSpec spec{std::vector<std::string>(start.argv().begin(), start.argv().end()), env, ""};
    rank->launch_mono = clock_->MonotonicNanos();
    rank->activity = ActivityTracker(rank->launch_mono);
    auto proc = Spawn(spec);
    if (!proc.ok()) {
      // Report it as an exit with the conventional "cannot execute" code.
      rank->running = false;
      rank->exit = ExitInfo{127, 0};
      v1::AgentMessage m;
      m.mutable_rank_exited()->set_generation(generation_);
      *m.mutable_rank_exited()->mutable_rank() = Describe(*rank);
      m.mutable_rank_exited()->add_log_tail(proc.status().message());
      m.mutable_rank_exited()->set_exit_unix_ms(clock_->WallNanos() / kMillisecond);
      Send(m);
      ranks_.push_back(std::move(rank));
      continue;
    }
    rank->pid = proc->pid;
    rank->pids.insert(proc->pid);
    rank->running = true;
    OutputPump::LineSink sink;
    if (scan_rules_ != nullptr) {
      sink = [this, generation = generation_, global = rank->global_rank](const std::string& line) {
        ScanLine(generation, global, line);
      };
    }
    rank->output = std::make_unique<OutputPump>(
        proc->stdout_fd, proc->stderr_fd, log_base,
        "[rank" + std::to_string(rank->global_rank) + "]: ", config_.stream_output,
        static_cast<size_t>(config_.log_tail_lines), sink);
    *started.mutable_started()->add_ranks() = Describe(*rank);
    ranks_.push_back(std::move(rank));
  }
  started.mutable_started()->set_started_unix_ms(clock_->WallNanos() / kMillisecond);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids_.clear();
    for (const auto& r : ranks_) pids_.push_back(r->pid);
  }
  Send(started);
}

v1::RankStatus Agent::Describe(const Rank& rank) const {
  v1::RankStatus s;
  s.set_local_rank(rank.local_rank);
  s.set_global_rank(rank.global_rank);
  s.set_running(rank.running);
  s.set_pid(rank.pid);
  s.set_exit_code(rank.exit.exit_code);
  s.set_term_signal(rank.exit.signal);
  Nanos now_mono = MonotonicNowNanos();  // the client stamps CLOCK_MONOTONIC
  Nanos now_wall = WallNowNanos();
  auto to_unix_ms = [&](Nanos mono) { return mono == 0 ? 0 : (now_wall - (now_mono - mono)) / kMillisecond; };
  s.set_step(kNoStep);
  s.set_checkpoint_step(kNoStep);
  Nanos since = rank.launch_mono;
  if (rank.page.get() != nullptr) {
    StatusSnapshot snap = ReadStatusPage(*rank.page.get());
    s.set_attached(snap.attached);
    s.set_step(snap.step);
    s.set_step_count(snap.step_count);
    s.set_first_step_unix_ms(to_unix_ms(snap.first_step_mono_ns));
    s.set_last_step_unix_ms(to_unix_ms(snap.last_step_mono_ns));
    s.set_checkpoint_step(snap.checkpoint_step);
    s.set_checkpoint_blocked_ms(snap.checkpoint_blocked_ns / kMillisecond);
    s.set_checkpoint_blocked_us(snap.checkpoint_blocked_ns / 1000);
    s.set_max_step_ms(snap.max_step_ns / kMillisecond);
    s.set_phase(snap.phase);
    if (snap.phase_mono_ns > 0) s.set_phase_age_ms((now_mono - snap.phase_mono_ns) / kMillisecond);
    if (snap.last_step_mono_ns > 0) since = snap.last_step_mono_ns;
    DescribeJournal(ReadJournal(rank.page.get()->journal), now_mono, &s);
  }
  s.set_progress_age_ms(std::max<Nanos>(0, now_mono - since) / kMillisecond);
  if (rank.running) s.set_proc_state(ProcState(rank.pid));
  if (rank.running && rank.activity.sampled()) {
    s.set_activity_sampled(true);
    s.set_activity_age_ms(std::max<Nanos>(0, clock_->MonotonicNanos() - rank.activity.last_change()) /
                          kMillisecond);
  }
  return s;
}

void Agent::ReapExited() {
  for (auto& rank : ranks_) {
    if (!rank->running) continue;
    auto exit = TryReap(rank->pid);
    if (!exit) continue;
    Nanos exit_wall = clock_->WallNanos();
    rank->running = false;
    rank->exit = *exit;
    SignalGroup(rank->pid, SIGKILL);  // whatever the rank left behind in its group
    if (rank->page.get() != nullptr) rank->timings.Poll(*rank->page.get());
    SendTimings(true);  // the rank's last steps go before its exit
    if (rank->output) rank->output->Finish(500 * kMillisecond);
    v1::AgentMessage m;
    v1::RankExited* e = m.mutable_rank_exited();
    e->set_generation(generation_);
    *e->mutable_rank() = Describe(*rank);
    if (rank->output) {
      for (const auto& line : rank->output->Tail()) e->add_log_tail(line);
    }
    // The reap can lag the exit by a poll interval, and several ranks that
    // died together are reaped in rank order; the end of the rank's output
    // tells the order they really died in.
    if (rank->output && rank->output->eof_wall() > 0) {
      exit_wall = std::min(exit_wall, rank->output->eof_wall());
    }
    e->set_exit_unix_ms(exit_wall / kMillisecond);
    if (exit->exit_code != 0 || exit->signal != 0) {
      if (auto error = ReadErrorFile(rank->error_file)) *e->mutable_error() = *error;
      PollKernel();
      for (const auto& line : KernelLines(RankProcesses())) e->add_kernel_lines(line);
    }
    Send(m);
  }
}

void Agent::PollTimings() {
  for (auto& rank : ranks_) {
    if (rank->running && rank->page.get() != nullptr) rank->timings.Poll(*rank->page.get());
  }
}

void Agent::SendTimings(bool flush) {
  if (generation_ < 0) return;
  v1::AgentMessage m;
  v1::Timings* t = m.mutable_timings();
  t->set_generation(generation_);
  std::map<std::string, int> names;
  // The pages' clock (CLOCK_MONOTONIC) to this node's wall clock.
  const std::int64_t to_unix_ns = WallNowNanos() - MonotonicNowNanos();
  std::int64_t dropped = 0;
  for (auto& rank : ranks_) {
    dropped += rank->timings.dropped();
    AddSteps(rank->global_rank, rank->timings.Take(flush || !rank->running), to_unix_ns, t, &names);
  }
  t->set_dropped(dropped);
  if (t->steps_size() > 0) Send(m);
}

std::set<int> Agent::RankProcesses() const {
  std::set<int> ours;
  for (const auto& rank : ranks_) ours.insert(rank->pids.begin(), rank->pids.end());
  return ours;
}

std::vector<std::string> Agent::KernelLines(const std::set<int>& ours) const {
  std::vector<std::string> lines =
      WithoutOthersOomReports(kernel_.Recent(kKernelWindow, kKernelLinesRead), ours);
  if (lines.size() > kKernelLines) lines.erase(lines.begin(), lines.end() - kKernelLines);
  return lines;
}

void Agent::SendHeartbeat() {
  v1::AgentMessage m;
  v1::Heartbeat* hb = m.mutable_heartbeat();
  hb->set_generation(generation_);
  std::vector<pid_t> groups;
  for (const auto& rank : ranks_) {
    if (rank->running) groups.push_back(rank->pid);
  }
  std::map<pid_t, GroupActivity> activity = SampleGroupsActivity(groups);
  Nanos sampled = clock_->MonotonicNanos();
  for (const auto& rank : ranks_) {
    if (rank->running) {
      rank->activity.Update(activity[rank->pid], sampled);
      rank->pids.insert(activity[rank->pid].pids.begin(), activity[rank->pid].pids.end());
    }
    *hb->add_ranks() = Describe(*rank);
  }
  double load1 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
    std::fclose(f);
  }
  hb->mutable_metrics()->set_load1(load1);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t value;
  std::string unit;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemTotal:") hb->mutable_metrics()->set_mem_total_kb(value);
    if (key == "MemAvailable:") hb->mutable_metrics()->set_mem_available_kb(value);
  }
  struct statvfs vfs;
  if (statvfs(config_.run_dir.c_str(), &vfs) == 0) {
    hb->mutable_metrics()->set_disk_free_kb(
        static_cast<std::int64_t>(vfs.f_bavail) * vfs.f_frsize / 1024);
  }
  for (const LinkReading& r : ReadLinks()) {
    v1::LinkStats* l = hb->mutable_metrics()->add_links();
    l->set_name(r.name);
    l->set_kind(r.kind);
    l->set_up(r.up);
    l->set_carrier_changes(r.carrier_changes);
    l->set_rx_bytes(r.rx_bytes);
    l->set_tx_bytes(r.tx_bytes);
    l->set_rx_packets(r.rx_packets);
    l->set_tx_packets(r.tx_packets);
    l->set_rx_dropped(r.rx_dropped);
    l->set_tx_dropped(r.tx_dropped);
    l->set_rx_errors(r.rx_errors);
    l->set_tx_errors(r.tx_errors);
  }
  hb->set_sent_unix_ms(clock_->WallNanos() / kMillisecond);
  Send(m);
}

void Agent::StopRanks(std::int64_t generation, const std::vector<int>& capture, Nanos grace,
                      bool report) {
  v1::AgentMessage reply;
  v1::Stopped* stopped = reply.mutable_stopped();
  stopped->set_generation(generation);
  // Ranks that ended on their own before the stop are failures to report.
  if (report) ReapExited();

  // 1. Stacks of the ranks the controller asked about, in parallel.
  std::vector<Rank*> to_capture;
  for (auto& rank : ranks_) {
    if (rank->running &&
        std::find(capture.begin(), capture.end(), rank->global_rank) != capture.end()) {
      to_capture.push_back(rank.get());
    }
  }
  std::vector<v1::RankStacks> stacks(to_capture.size());
  std::vector<std::thread> workers;
  for (size_t i = 0; i < to_capture.size(); ++i) {
    workers.emplace_back([this, rank = to_capture[i], out = &stacks[i]] {
      out->set_global_rank(rank->global_rank);
      std::string state = ProcState(rank->pid);
      out->set_proc_state(state);
      std::string head = ReadFrom(rank->stacks_path, 0);
      if (head.rfind(kStacksReadyMarker, 0) == 0) {
        off_t before = FileSize(rank->stacks_path);
        kill(rank->pid, SIGUSR1);
        if (state == "T" || state == "t") kill(rank->pid, SIGCONT);
        Nanos deadline = MonotonicNowNanos() + config_.stack_timeout;
        off_t last = before;
        Nanos stable_since = 0;
        while (MonotonicNowNanos() < deadline) {
          usleep(20000);
          const std::string now_state = ProcState(rank->pid);
          if (now_state.empty() || now_state == "Z" || now_state == "X") break;  // it died: no stack will come
          off_t size = FileSize(rank->stacks_path);
          if (size != last) {
            last = size;
            stable_since = MonotonicNowNanos();
          } else if (size > before && MonotonicNowNanos() - stable_since > 150 * kMillisecond) {
            break;
          }
        }
        out->set_python(ReadFrom(rank->stacks_path, before));
      }
      if (config_.native_stacks) {
        out->set_native(RunCapture("timeout 10 gdb -nx -batch -p " + std::to_string(rank->pid) +
                                   " -ex 'thread apply all bt' 2>/dev/null"));
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& s : stacks) *stopped->add_stacks() = s;

  // 2. SIGTERM (and SIGCONT, so a stopped rank can act on it), then SIGKILL.
  for (auto& rank : ranks_) {
    if (!rank->running) continue;
    SignalGroup(rank->pid, SIGTERM);
    SignalGroup(rank->pid, SIGCONT);
  }
  Nanos deadline = MonotonicNowNanos() + grace;
  auto any_running = [&] {
    bool any = false;
    for (auto& rank : ranks_) {
      if (!rank->running) continue;
      if (auto exit = TryReap(rank->pid)) {
        rank->running = false;
        rank->exit = *exit;
      } else {
        any = true;
      }
    }
    return any;
  };
  while (any_running() && MonotonicNowNanos() < deadline) usleep(10000);
  for (auto& rank : ranks_) {
    if (rank->running) SignalGroup(rank->pid, SIGKILL);
  }
  // A SIGKILLed process dies unless it sits in uninterruptible sleep; wait for
  // it, bounded, and report what could not be reaped.
  Nanos kill_deadline = MonotonicNowNanos() + 10 * kSecond;
  while (any_running() && MonotonicNowNanos() < kill_deadline) usleep(10000);
  for (auto& rank : ranks_) {
    if (rank->running) {
      std::fprintf(stderr, "trainguard agent %s: rank %d (pid %d) survived SIGKILL (state %s)\n",
                   config_.node_id.c_str(), rank->global_rank, rank->pid,
                   ProcState(rank->pid).c_str());
    }
    SignalGroup(rank->pid, SIGKILL);  // leftovers of the group
    if (rank->output) rank->output->Finish(200 * kMillisecond);
    if (report && rank->output) {
      // What each rank printed last: a rank that was about to fail when the
      // stop came (a NaN guard, say) explains the incident only here.
      v1::RankExited* r = stopped->add_ranks();
      r->set_generation(generation);
      *r->mutable_rank() = Describe(*rank);
      for (const auto& line : rank->output->Tail()) r->add_log_tail(line);
    }
    if (rank->page.get() != nullptr) {
      rank->timings.Poll(*rank->page.get());
      unlink(rank->page.path().c_str());
    }
  }
  SendTimings(true);
  std::set<int> ours;
  for (const auto& rank : ranks_) ours.insert(rank->pids.begin(), rank->pids.end());
  ranks_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids_.clear();
  }
  if (report) {
    PollKernel();
    for (const auto& line : KernelLines(ours)) stopped->add_kernel_lines(line);
    stopped->set_free_port(FindFreePort());
    stopped->set_stopped_unix_ms(clock_->WallNanos() / kMillisecond);
    Send(reply);
  }
}

}  // namespace trainguard
