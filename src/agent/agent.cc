// Agent: the node's agent — its loop, heartbeats, log scanning, timings and
// the kernel log. A generation's rank processes: agent_ranks.cc (start,
// describe, reap) and agent_stop.cc (stacks, stop); the controller session:
// agent_session.cc; diagnostics orders: agent_diagnostics.cc.
#include "agent/agent.h"
#include "agent/agent_memory.h"
#include "agent/agent_rank.h"
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
#include "agent/mount_io.h"
#include "agent/output_pump.h"
#include "agent/process.h"
#include "common/small_file.h"
#include "common/status_page.h"
#include "diag/collective_probe.h"
#include "diag/suite.h"
#include "proto/sanitize.h"

namespace trainguard {

namespace fs = std::filesystem;




// Kernel messages older than this are not sent with a failure.
constexpr Nanos kKernelWindow = 10 * 60 * kSecond;
constexpr size_t kKernelLines = 50;       // sent with a failure
constexpr size_t kKernelLinesRead = 500;  // looked through for them

Agent::Agent(AgentConfig config, Clock* clock, ControllerLink* link)
    : config_(std::move(config)), clock_(clock), link_(link),
      kernel_(config_.kernel_log.empty() ? "/nonexistent" : config_.kernel_log),
      warm_(std::make_unique<WarmState>()) {
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
  DropStandbys();
  DropMemoryCheckpoints();
}

void Agent::OnCommand(const v1::ControllerMessage& msg) {
  std::int64_t seen = highest_epoch_.load();
  while (msg.lead_epoch() > seen && !highest_epoch_.compare_exchange_weak(seen, msg.lead_epoch())) {
  }
  if (msg.lead_epoch() < seen) {
    // A leader deposed since: nothing of it is acted on; the session goes,
    // and the next controller address is tried.
    link_->Abandon("the controller's lead (epoch " + std::to_string(msg.lead_epoch()) + ") was taken over (epoch " +
                   std::to_string(seen) + ")");
    return;
  }
  last_heard_mono_.store(clock_->MonotonicNanos(), std::memory_order_relaxed);
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
  // What agents killed on this host (SIGKILL, the OOM killer) could not
  // remove: status pages no process holds, and node-memory checkpoint copies
  // whose agent is gone (gigabytes a rank, in /dev/shm: a full /dev/shm
  // fails the next job's NCCL).
  const int pages = RemoveStalePages(config_.shm_dir, "trainguard-", 10);
  const int copies = RemoveOrphanedCopies(config_.shm_dir);
  if (pages + copies > 0) {
    std::fprintf(stderr,
                 "trainguard agent %s: removed %d status page(s) and %d checkpoint copy director%s in %s that "
                 "agents killed on this host left\n",
                 config_.node_id.c_str(), pages, copies, copies == 1 ? "y" : "ies", config_.shm_dir.c_str());
  }
  peer_server_ = std::make_unique<PeerServer>();
  if (Status s = peer_server_->Start(config_.address); !s.ok()) {
    std::fprintf(stderr, "trainguard agent: warning: %s; this node's network is not probed\n", s.message().c_str());
  }
  StartMemoryServer();
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
        last_heard_mono_.store(clock_->MonotonicNanos(), std::memory_order_relaxed);
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
        controller_silence_ = m.welcome().silence_ms() * kMillisecond;
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
      } else if (m.has_verified()) {
        verified_step_ = std::max(verified_step_, m.verified().step());
        for (auto& r : ranks_) {
          if (r->page.get() != nullptr) r->page.get()->verified_step.store(verified_step_, std::memory_order_release);
        }
      } else if (m.has_checkpoint_plan()) {
        // To the ranks' pages, where Checkpointer(save_every="auto") reads it
        // (docs/checkpoint_policy.md); said once per plan.
        plan_memory_ms_ = m.checkpoint_plan().memory_interval_ms();
        plan_storage_ms_ = m.checkpoint_plan().storage_interval_ms();
        for (auto& r : ranks_) WriteCheckpointPlan(r->page.get());
        if (m.checkpoint_plan().basis() != checkpoint_plan_) {
          checkpoint_plan_ = m.checkpoint_plan().basis();
          std::fprintf(stderr, "trainguard agent %s: checkpoint plan: %s\n", config_.node_id.c_str(),
                       checkpoint_plan_.c_str());
        }
      } else if (m.has_prepare_standby() && welcomed) {
        PrepareSpareStandbys(m.prepare_standby());
      } else if (m.has_run_diagnostics() && welcomed) {
        StartDiagnostics(m.run_diagnostics());
      } else if (m.has_shutdown()) {
        if (m.shutdown().reason().rfind("evicted", 0) == 0) {
          std::fprintf(stderr, "trainguard agent %s: %s\n", config_.node_id.c_str(), m.shutdown().reason().c_str());
        }
        StopRanks(generation_, {}, 0, false);
        DropStandbys();
        DropMemoryCheckpoints();
        std::lock_guard<std::mutex> lock(mu_);
        job_exit_status_ = m.shutdown().exit_status();
        return 0;
      }
    }
    if (welcomed && controller_silence_ > 0) {
      const Nanos now = clock_->MonotonicNanos();
      const Nanos heard = last_heard_mono_.load(std::memory_order_relaxed);
      bool away = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        away = away_;
      }
      if (!away && now - heard > controller_silence_) {
        last_heard_mono_.store(now, std::memory_order_relaxed);  // once per silence
        std::fprintf(stderr, "trainguard agent %s: no word from the controller for %.1f s: trying the next one\n",
                     config_.node_id.c_str(), static_cast<double>(now - heard) / kSecond);
        link_->Abandon("the controller fell silent");
      }
    }
    PollKernel();
    if (welcomed) SendAlerts();
    MaybeSendDiagnostics();
    PollTimings();
    AwaitStandbys();
    ReapExited();
    MaybeMakeStandbys();
    MaybePushMemoryCopies();
    if (welcomed && clock_->MonotonicNanos() >= next_heartbeat_) {
      SendTimings(false);
      SendHeartbeat();
      next_heartbeat_ = clock_->MonotonicNanos() + heartbeat_interval_;
    }
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
      const GroupActivity& a = activity[rank->pid];
      rank->activity.Update(a, sampled);
      rank->pids.insert(a.pids.begin(), a.pids.end());
      // A worker that exits takes its count with it: only growth is reading.
      if (a.rchar > rank->rchar_seen && rank->read_changed >= 0) rank->read_changed = sampled;
      if (rank->read_changed < 0) rank->read_changed = sampled;
      rank->rchar_seen = a.rchar;
      rank->last_sample = a;
      // Every thread of a quiet rank (a hang's suspect), else only the main
      // threads already seen in state D: nothing more while it computes.
      const bool quiet = sampled - rank->activity.last_change() >= heartbeat_interval_;
      rank->blocked_now = rank->blocked.Update(
          quiet ? FindBlockedTasks(a.pids, true) : FindBlockedTasks(a.uninterruptible, false), sampled);
    }
    *hb->add_ranks() = Describe(*rank);
  }
  double load1 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
    std::fclose(f);
  }
  hb->mutable_metrics()->set_load1(load1);
  const CpuPressureSample cpu = cpu_pressure_.Sample(groups, sampled);
  hb->mutable_metrics()->set_cpu_throttled_pct(cpu.throttled_pct);
  hb->mutable_metrics()->set_cpu_steal_pct(cpu.steal_pct);
  hb->mutable_metrics()->set_cpu_cores(cpu.cores);
  const TcpSegments tcp = ParseTcpSegments(ReadSmallFile("/proc/net/snmp"));
  hb->mutable_metrics()->set_tcp_retrans_pct(RetransmitPercent(tcp_last_, tcp));
  tcp_last_ = tcp;
  if (!gpfs_) {
    // mmpmon forks a shell and the program: every 5 s at most (0.1 % of a core).
    const char* mmpmon = std::getenv("TRAINGUARD_MMPMON");
    gpfs_ = std::make_unique<GpfsSampler>(mmpmon != nullptr ? mmpmon : "/usr/lpp/mmfs/bin/mmpmon",
                                          std::max<Nanos>(heartbeat_interval_, 5 * kSecond));
  }
  for (const MountIo& io : SampleMountIo("/proc", "/sys", gpfs_->Latest())) {
    if (hb->metrics().mounts_size() >= 32) break;
    v1::MountIo* out = hb->mutable_metrics()->add_mounts();
    out->set_mount_point(io.mount.mount_point);
    out->set_fstype(io.mount.fstype);
    out->set_source(io.mount.source);
    out->set_read_bytes(io.read_bytes);
    out->set_write_bytes(io.write_bytes);
    out->set_reads(io.reads);
    out->set_writes(io.writes);
    out->set_metadata_ops(io.metadata_ops);
  }
  if (!gpus_) {
    GpuTelemetry::Options o;
    if (const char* nvml = std::getenv("TRAINGUARD_NVML_LIBRARY")) o.nvml_path = nvml;
    o.interval = heartbeat_interval_;
    gpus_ = std::make_unique<GpuTelemetry>(o);
  }
  for (const GpuSample& g : gpus_->Latest()) FillGpuHealth(g, hb->mutable_metrics()->add_gpus());

  hb->mutable_metrics()->set_memory_checkpoint_bytes(MemoryCopyBytes());
  for (const auto& [local, standby] : warm_->standbys) {
    if (standby->state() != Standby::State::kReady) continue;
    hb->mutable_metrics()->set_standbys_ready(hb->metrics().standbys_ready() + 1);
    hb->mutable_metrics()->set_standby_rss_kb(hb->metrics().standby_rss_kb() + standby->rss_kb());
  }
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
  for (const LinkReading& r : ReadLinks(InterfacesHolding(config_.address))) {
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

}  // namespace trainguard
