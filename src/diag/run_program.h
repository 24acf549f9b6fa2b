// Runs a tool a probe needs (the job's Python, nvidia-smi, dcgmi) in a
// process group of its own, collects its standard output, and kills the
// group at the deadline. Its standard error goes where the agent's goes.
// The tool is killed (PR_SET_PDEATHSIG) when the calling thread's process
// goes away: it never outlives the agent. It must not fork helpers that
// outlive it (the collective probe's ranks set the same on themselves).
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"

namespace trainguard {

struct ProgramResult {
  bool started = false;    // false: fork or exec failed (`error` says which)
  bool timed_out = false;  // killed at the deadline
  int exit_code = -1;      // when it exited
  int signal = 0;          // when a signal ended it
  std::string output;      // standard output, the first MiB
  std::string error;       // why it did not start
  // "exit 3", "signal 9", "killed after 30 s", "cannot run X: ...".
  std::string Describe(const std::string& program) const;
};

ProgramResult RunProgram(const std::vector<std::string>& argv, Nanos timeout);

}  // namespace trainguard
