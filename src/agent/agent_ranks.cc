// Agent: a generation's rank processes — started with the torchrun
// environment, described for heartbeats, reaped when they exit.
#include "agent/agent.h"
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
#include "agent/output_pump.h"
#include "agent/process.h"
#include "common/status_page.h"
#include "diag/collective_probe.h"
#include "diag/suite.h"
#include "proto/sanitize.h"

namespace trainguard {

namespace fs = std::filesystem;

std::map<std::string, std::string> Agent::RanksEnvironment(const v1::Start& start) const {
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
  if (std::string root = instrument ? MemoryRoot(start) : ""; !root.empty()) {
    base["TRAINGUARD_MEMORY_CHECKPOINTS"] = root;
    base["TRAINGUARD_MEMORY_CHECKPOINTS_KEEP"] = std::to_string(start.memory_checkpoints());
  }
  return base;
}

void Agent::StartRanks(const v1::Start& start) {
  generation_ = start.generation();
  group_rank_ = start.group_rank();
  const std::map<std::string, std::string> base = RanksEnvironment(start);
  const bool instrument = !start.no_instrument();
  PrepareWarm(start, instrument);

  {
    std::lock_guard<std::mutex> lock(mu_);
    pids_.clear();
  }
  pending_started_.emplace();
  v1::RanksStarted* started = pending_started_->mutable_started();
  started->set_generation(generation_);
  PrepareMemoryCopies(start, started);
  // Pages an earlier agent of this node left when it was killed.
  RemoveStalePages(config_.shm_dir, "trainguard-" + start.run_id() + "-" + config_.node_id + "-");
  for (int local = 0; local < start.nproc_per_node(); ++local) {
    auto rank = std::make_unique<Rank>();
    rank->local_rank = local;
    rank->global_rank = start.group_rank() * start.nproc_per_node() + local;
    // The agent's pid in the name: two jobs of the same id on one host
    // (two stores, two users) must never share a page.
    std::string page_path =
        config_.shm_dir + "/" + StatusPageName(start.run_id(), config_.node_id, getpid(), rank->global_rank);
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
    // One ledger per rank for the whole job (its environment stays the same from one start to
    // the next, as a warm standby's must): a new generation reads it from the start again, and the
    // controller keeps each directory once.
    rank->save_ledger = config_.run_dir + "/errors/rank" + std::to_string(rank->global_rank) + ".saves";
    if (instrument) env["TRAINGUARD_SAVE_LEDGER"] = rank->save_ledger;
    if (warm_->enabled && warm_->cmd) env["TRAINGUARD_IMPORTS_FILE"] = ImportsFile(local);
    if (page.ok()) {
      rank->page = std::move(page.value());
      rank->page.get()->verified_step.store(verified_step_, std::memory_order_release);
      WriteCheckpointPlan(rank->page.get());
      if (instrument) env["TRAINGUARD_STATUS_PAGE"] = page_path;
    } else {
      std::fprintf(stderr, "trainguard agent %s: rank %d runs without a status page: %s\n",
                   config_.node_id.c_str(), rank->global_rank, page.status().ToString().c_str());
    }
    warm_->env[local] = env;
    SpawnSpec spec{std::vector<std::string>(start.argv().begin(), start.argv().end()), std::move(env), ""};
    rank->launch_mono = clock_->MonotonicNanos();
    if (warm_->enabled && AwaitStandby(rank, spec, log_base)) continue;
    StatusOr<SpawnedProcess> proc = InvalidArgument("not started");
    if (warm_->enabled) {
      if (auto warm = StartWarm(local, spec.argv, spec.env, &rank->cold_reason)) {
        proc = *warm;
        rank->warm = true;
      }
    }
    if (!rank->warm) proc = Spawn(spec);
    LaunchRank(std::move(rank), std::move(proc), log_base);
  }
  MaybeSendStarted();
}

void Agent::LaunchRank(std::unique_ptr<Rank> rank, StatusOr<SpawnedProcess> proc, const std::string& log_base) {
  // Quiet from its spawn on, not from before a standby was tried: the
  // hang detector judges a rank with no status page yet by this.
  rank->activity = ActivityTracker(clock_->MonotonicNanos());
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
    return;
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
  if (pending_started_) *pending_started_->mutable_started()->add_ranks() = Describe(*rank);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids_.push_back(rank->pid);
  }
  ranks_.push_back(std::move(rank));
}

void Agent::WriteCheckpointPlan(StatusPage* page) const {
  if (page == nullptr) return;
  page->plan_memory_interval_ms.store(plan_memory_ms_, std::memory_order_release);
  page->plan_storage_interval_ms.store(plan_storage_ms_, std::memory_order_release);
}

void Agent::MaybeSendStarted() {
  if (!pending_started_ || !warm_->awaited.empty()) return;
  v1::RanksStarted* started = pending_started_->mutable_started();
  // In local rank order, as they were asked for, whichever waited.
  std::sort(started->mutable_ranks()->begin(), started->mutable_ranks()->end(),
            [](const v1::RankStatus& a, const v1::RankStatus& b) { return a.local_rank() < b.local_rank(); });
  started->set_started_unix_ms(clock_->WallNanos() / kMillisecond);
  Send(*pending_started_);
  pending_started_.reset();
}

// New lines of the rank's torch.save ledger (directories, written by the
// instrumentation once per directory per process): at most 64 KiB a report.
void Agent::ReadSaveLedger(const Rank& rank, v1::RankStatus* s) const {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(rank.save_ledger, ec);
  if (ec || size <= rank.save_ledger_read) return;
  std::ifstream in(rank.save_ledger, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(rank.save_ledger_read));
  std::string chunk(static_cast<std::size_t>(std::min<std::uintmax_t>(size - rank.save_ledger_read, 65536)), '\0');
  in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<std::size_t>(in.gcount()));
  const std::size_t end = chunk.rfind('\n');
  if (end == std::string::npos) return;  // a line still being written
  std::size_t from = 0;
  while (from <= end) {
    const std::size_t nl = chunk.find('\n', from);
    if (nl > from && nl - from <= 4096) s->add_torch_checkpoint_dirs(chunk.substr(from, nl - from));
    from = nl + 1;
  }
  rank.save_ledger_read += end + 1;
}

v1::RankStatus Agent::Describe(const Rank& rank) const {
  v1::RankStatus s;
  s.set_local_rank(rank.local_rank);
  s.set_global_rank(rank.global_rank);
  s.set_running(rank.running);
  s.set_pid(rank.pid);
  s.set_exit_code(rank.exit.exit_code);
  s.set_term_signal(rank.exit.signal);
  s.set_warm(rank.warm);
  s.set_cold_reason(rank.cold_reason);
  if (rank.standby_wait >= 0) s.set_standby_wait_ms(rank.standby_wait / kMillisecond);
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
    if (snap.first_step != kNoStep) {
      s.set_first_step(snap.first_step);
    } else if (!rank.running && snap.first_step_mono_ns > 0) {  // it ended before a second step settled it
      s.set_first_step(snap.step - std::max<std::int64_t>(snap.step_count, 1) + 1);
    }
    s.set_last_step_unix_ms(to_unix_ms(snap.last_step_mono_ns));
    s.set_checkpoint_step(snap.checkpoint_step);
    s.set_checkpoint_blocked_ms(snap.checkpoint_blocked_ns / kMillisecond);
    s.set_checkpoint_blocked_us(snap.checkpoint_blocked_ns / 1000);
    s.set_checkpoint_waited_us(snap.checkpoint_waited_ns / 1000);
    s.set_checkpoint_saves(snap.checkpoint_saves);
    s.mutable_io()->set_files_opened(snap.attached ? snap.files_opened : -1);
    s.set_max_step_ms(snap.max_step_ns / kMillisecond);
    s.set_phase(snap.phase);
    if (snap.phase_mono_ns > 0) s.set_phase_age_ms((now_mono - snap.phase_mono_ns) / kMillisecond);
    if (snap.last_step_mono_ns > 0) since = snap.last_step_mono_ns;
    DescribeJournal(ReadJournal(rank.page.get()->journal), now_mono, &s);
    auto mark = [&](int i, void (v1::RankStatus::*set)(std::int64_t)) {
      if (snap.startup_mono_ns[i] > 0) (s.*set)((snap.startup_mono_ns[i] - rank.launch_mono) / kMillisecond);
    };
    mark(kMarkScriptStart, &v1::RankStatus::set_script_start_ms);
    mark(kMarkPgInitBegin, &v1::RankStatus::set_pg_init_begin_ms);
    mark(kMarkPgInitEnd, &v1::RankStatus::set_pg_init_end_ms);
    mark(kMarkRestoreBegin, &v1::RankStatus::set_restore_begin_ms);
    mark(kMarkRestoreEnd, &v1::RankStatus::set_restore_end_ms);
    if (snap.resumed_step != kNoStep) s.set_resumed_step(snap.resumed_step);
    for (const auto& [step, value] : snap.fingerprints) {
      if (step <= rank.fingerprints_sent_step) continue;
      v1::Fingerprint* f = s.add_fingerprints();
      f->set_step(step);
      f->set_value(value);
      rank.fingerprints_sent_step = step;
    }
    if (snap.numeric_step != kNoStep) {
      s.mutable_numeric()->set_step(snap.numeric_step);
      s.mutable_numeric()->set_kind(static_cast<int>(snap.numeric_kind));
      s.mutable_numeric()->set_value(snap.numeric_value);
    }
    if (snap.spike_step != kNoStep) {
      s.mutable_spike()->set_step(snap.spike_step);
      s.mutable_spike()->set_kind(static_cast<int>(snap.spike_kind));
      s.mutable_spike()->set_value(snap.spike_value);
    }
    s.set_losses_observed(snap.losses_observed);
    ReadSaveLedger(rank, &s);
    if (snap.first_step_mono_ns > 0) s.set_first_step_ms((snap.first_step_mono_ns - rank.launch_mono) / kMillisecond);
  }
  s.set_progress_age_ms(std::max<Nanos>(0, now_mono - since) / kMillisecond);
  if (rank.running) {
    const GroupActivity& a = rank.last_sample;
    v1::StorageIo* io = s.mutable_io();
    io->set_rchar(static_cast<std::int64_t>(a.rchar));
    io->set_wchar(static_cast<std::int64_t>(a.wchar));
    io->set_syscr(static_cast<std::int64_t>(a.syscr));
    io->set_syscw(static_cast<std::int64_t>(a.syscw));
    io->set_read_bytes(static_cast<std::int64_t>(a.read_bytes));
    io->set_write_bytes(static_cast<std::int64_t>(a.write_bytes));
    const Nanos read_age =
        rank.read_changed < 0 ? -1 : std::max<Nanos>(0, clock_->MonotonicNanos() - rank.read_changed);
    io->set_read_age_ms(read_age < 0 ? -1 : read_age / kMillisecond);
    // Waiting for data and reading nothing: where its data comes from (the
    // hang detector's storage sign; listing descriptors costs, so only then).
    if (s.phase() == "data" && read_age >= heartbeat_interval_) {
      std::set<std::string> ours = {rank.stacks_path, rank.error_file};
      for (const OpenFile& f : OpenDataFiles(a.pids, ours)) {
        v1::OpenFile* out = io->add_data_files();
        out->set_path(f.path);
        out->set_mount_point(f.mount.mount_point);
        out->set_fstype(f.mount.fstype);
        out->set_source(f.mount.source);
      }
    }
    for (const auto& b : rank.blocked_now) {
      if (s.blocked_io_size() >= 8) break;
      v1::BlockedIo* out = s.add_blocked_io();
      out->set_pid(b.task.pid);
      out->set_tid(b.task.tid);
      out->set_call(b.task.call);
      out->set_path(b.task.path);
      out->set_mount_point(b.task.mount.mount_point);
      out->set_fstype(b.task.mount.fstype);
      out->set_source(b.task.mount.source);
      out->set_blocked_ms(std::max<Nanos>(0, clock_->MonotonicNanos() - b.since) / kMillisecond);
    }
  }
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
    // Its last words, if they came shortly before the end: a peer's error
    // about this rank's death comes during this rank's teardown, after them.
    constexpr Nanos kLastWordsBeforeExit = 10 * kSecond;
    const Nanos last_words = rank->output ? rank->output->last_line_wall() : 0;
    if (last_words > 0 && last_words <= exit_wall && exit_wall - last_words <= kLastWordsBeforeExit) {
      e->set_last_words_unix_ms(last_words / kMillisecond);
    }
    if (exit->exit_code != 0 || exit->signal != 0) {
      HurryStandbys();  // a restart is coming
      if (auto error = ReadErrorFile(rank->error_file)) *e->mutable_error() = *error;
      PollKernel();
      for (const auto& line : KernelLines(RankProcesses())) e->add_kernel_lines(line);
    }
    Send(m);
  }
}

}  // namespace trainguard
