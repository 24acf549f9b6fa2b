// Process helpers of the agent: spawning a rank in its own process group,
// reaping it, signalling its group, and reading facts about it from /proc.
//
// Spawn() must be called from a thread that lives as long as the agent:
// children get PR_SET_PDEATHSIG(SIGKILL), which fires when the *thread* that
// forked them exits, so that a rank never outlives a killed agent.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "trainguard/status.h"

namespace trainguard {

struct SpawnSpec {
  std::vector<std::string> argv;             // argv[0] is looked up in PATH
  std::map<std::string, std::string> env;    // complete environment of the child
  std::string cwd;                           // "" = the agent's
  int pass_fd = -1;    // if >= 0: inherited by the child as fd 3 (warm standbys' control socket)
  int nice = 0;        // added to the child's niceness before exec
  bool idle = false;   // SCHED_IDLE: runs only when a CPU has nothing else to do
};

struct SpawnedProcess {
  pid_t pid = -1;       // also the process group id
  int stdout_fd = -1;   // read end of the child's stdout pipe (O_CLOEXEC)
  int stderr_fd = -1;   // read end of the child's stderr pipe (O_CLOEXEC)
};

// A child's stdout and stderr pipes (both ends O_CLOEXEC): [0] is read, [1] written.
struct OutputPipes {
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  void CloseAll();
};
StatusOr<OutputPipes> MakeOutputPipes();

// Starts the child in a new process group with stdout and stderr going to
// two pipes, kept apart.
StatusOr<SpawnedProcess> Spawn(const SpawnSpec& spec);

struct ExitInfo {
  int exit_code = 0;    // valid when signal == 0
  int signal = 0;
};

// Non-blocking reap; nullopt while the process runs.
std::optional<ExitInfo> TryReap(pid_t pid);

// Signals the whole process group; ignores a group that is already gone.
void SignalGroup(pid_t pgid, int sig);

// The state letter from /proc/PID/stat (R, S, D, T, t, Z, ...), "" if gone.
std::string ProcState(pid_t pid);

// What every process of a process group has consumed so far: CPU time
// (user + system) and bytes read and written through any file descriptor —
// sockets, pipes (its output), files (/proc/PID/io rchar + wchar).
struct GroupActivity {
  Nanos cpu = 0;
  std::uint64_t io_bytes = 0;
  int processes = 0;
  std::vector<pid_t> pids;  // the group's processes
  std::vector<pid_t> uninterruptible;  // those whose main thread is in state D
  // /proc/PID/io summed: rchar, wchar, syscr, syscw, read_bytes, write_bytes.
  std::uint64_t rchar = 0, wchar = 0, syscr = 0, syscw = 0, read_bytes = 0, write_bytes = 0;
};
// One pass over /proc for all the groups an agent watches.
std::map<pid_t, GroupActivity> SampleGroupsActivity(const std::vector<pid_t>& pgids);
GroupActivity SampleGroupActivity(pid_t pgid);

// Whether a rank is doing anything, from successive GroupActivity samples:
// the last time its CPU use (above a floor) or its I/O moved. Pure logic; the
// agent feeds it samples.
class ActivityTracker {
 public:
  // A sample's CPU counts as activity above this share of one core.
  static constexpr double kMinCpuShare = 0.02;
  explicit ActivityTracker(Nanos start) : last_change_(start), last_sample_mono_(start) {}
  void Update(const GroupActivity& sample, Nanos now_mono);
  Nanos last_change() const { return last_change_; }
  bool sampled() const { return sampled_; }

 private:
  Nanos last_change_;
  Nanos last_sample_mono_;
  GroupActivity last_;
  bool sampled_ = false;
};

// Looks `name` up in PATH (or returns it if it contains a '/').
StatusOr<std::string> FindExecutable(const std::string& name);

// The current environment as a map.
std::map<std::string, std::string> CurrentEnvironment();

// A TCP port that was free on this host a moment ago (0 on error).
int FindFreePort();

}  // namespace trainguard
