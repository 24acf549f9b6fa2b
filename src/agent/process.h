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

#include "trainguard/status.h"

namespace trainguard {

struct SpawnSpec {
  std::vector<std::string> argv;             // argv[0] is looked up in PATH
  std::map<std::string, std::string> env;    // complete environment of the child
  std::string cwd;                           // "" = the agent's
};

struct SpawnedProcess {
  pid_t pid = -1;       // also the process group id
  int output_fd = -1;   // read end of the child's stdout+stderr pipe (O_CLOEXEC)
};

// Starts the child in a new process group with stdout and stderr going to a pipe.
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

// Looks `name` up in PATH (or returns it if it contains a '/').
StatusOr<std::string> FindExecutable(const std::string& name);

// The current environment as a map.
std::map<std::string, std::string> CurrentEnvironment();

// A TCP port that was free on this host a moment ago (0 on error).
int FindFreePort();

}  // namespace trainguard
