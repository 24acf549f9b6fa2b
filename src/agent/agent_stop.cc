// Agent::StopRanks: a generation's ranks stopped — stacks captured first
// (faulthandler, gdb with --native-stacks), SIGTERM, the grace, SIGKILL.
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
#include "agent/file_calls.h"
#include "agent/journal_status.h"
#include "agent/link_stats.h"
#include "agent/output_pump.h"
#include "agent/process.h"
#include "common/small_file.h"
#include "common/status_page.h"
#include "diag/collective_probe.h"
#include "diag/suite.h"
#include "proto/sanitize.h"

namespace trainguard {

namespace fs = std::filesystem;

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

// How long a stack capture waits for a rank that stays in uninterruptible sleep.
constexpr Nanos kStackWaitInStateD = 200 * kMillisecond;
// How long a stop report waits for a GPU sample taken after the ranks stopped.
constexpr Nanos kFreshGpuSample = 2 * kSecond;

}  // namespace

void Agent::StopRanks(std::int64_t generation, const std::vector<int>& capture, Nanos grace,
                      bool report) {
  v1::AgentMessage reply;
  v1::Stopped* stopped = reply.mutable_stopped();
  stopped->set_generation(generation);
  // The next start is near: standbys still importing do so at full speed.
  HurryStandbys();
  // Ranks still awaiting their standby are not started any more; those
  // that did start are told first, in the Started message.
  for (auto& a : warm_->awaited) {
    if (a.rank->page.get() != nullptr) unlink(a.rank->page.path().c_str());
  }
  warm_->awaited.clear();
  if (pending_started_ && pending_started_->started().ranks_size() > 0) MaybeSendStarted();
  pending_started_.reset();
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
      const Nanos began = MonotonicNowNanos();
      if (head.rfind(kStacksReadyMarker, 0) == 0) {
        off_t before = FileSize(rank->stacks_path);
        kill(rank->pid, SIGUSR1);
        if (state == "T" || state == "t") kill(rank->pid, SIGCONT);
        Nanos deadline = MonotonicNowNanos() + config_.stack_timeout;
        off_t last = before;
        Nanos stable_since = 0;
        Nanos uninterruptible_since = 0;
        while (MonotonicNowNanos() < deadline) {
          usleep(20000);
          const std::string now_state = ProcState(rank->pid);
          if (now_state.empty() || now_state == "Z" || now_state == "X") break;  // it died: no stack will come
          // In uninterruptible sleep no signal handler runs until the kernel
          // call returns: a rank that stays in state D writes no stack, and
          // the stop does not wait the whole stack timeout for one.
          if (now_state != "D") {
            uninterruptible_since = 0;
          } else if (uninterruptible_since == 0) {
            uninterruptible_since = MonotonicNowNanos();
          } else if (MonotonicNowNanos() - uninterruptible_since > kStackWaitInStateD &&
                     FileSize(rank->stacks_path) == before) {
            out->set_proc_state("D");
            break;
          }
          off_t size = FileSize(rank->stacks_path);
          if (size != last) {
            last = size;
            stable_since = MonotonicNowNanos();
          } else if (size > before && MonotonicNowNanos() - stable_since > 150 * kMillisecond) {
            break;
          }
        }
        out->set_python(ReadFrom(rank->stacks_path, before));
        out->set_wait_ms((MonotonicNowNanos() - began) / kMillisecond);
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
      const std::string state = ProcState(rank->pid);
      std::fprintf(stderr, "trainguard agent %s: rank %d (pid %d) survived SIGKILL (state %s)\n",
                   config_.node_id.c_str(), rank->global_rank, rank->pid, state.c_str());
      v1::Unkillable* u = stopped->add_unkillable();
      u->set_global_rank(rank->global_rank);
      u->set_pid(rank->pid);
      u->set_proc_state(state);
      const std::string proc = "/proc/" + std::to_string(rank->pid);
      std::string wchan = ReadSmallFile(proc + "/wchan");
      u->set_wchan(wchan == "0" ? "" : wchan);
      std::istringstream call(ReadSmallFile(proc + "/syscall"));
      long nr = -1;
      if (call >> nr && nr >= 0) u->set_syscall(SystemCallName(nr));
      // In a file system call (or faulting a mapped file's page in): the
      // storage under it did not answer.
      u->set_on_file(nr == -1 || (nr >= 0 && !FileCallOf(nr).name.empty()));
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
      // A rank that raised and was still tearing down (its peers failed
      // first): its error file names the cause.
      if (auto error = ReadErrorFile(rank->error_file)) *r->mutable_error() = *error;
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
    if (gpus_) {
      for (const GpuSample& g : gpus_->Fresh(kFreshGpuSample)) FillGpuHealth(g, stopped->add_gpus());
    }
    stopped->set_free_port(FindFreePort());
    stopped->set_stopped_unix_ms(clock_->WallNanos() / kMillisecond);
    Send(reply);
  }
}

}  // namespace trainguard
