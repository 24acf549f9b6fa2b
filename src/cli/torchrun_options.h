// torchrun's command line for `trainguard run` (and `trainguard torchrun`):
// the options torchrun takes, in both spellings, resolved into a JobOptions
// with torchrun's meanings. What does not apply is accepted with a note;
// what trainguard cannot do yet is an error that says what to use instead.
#pragma once

#include <string>
#include <vector>

#include "cli/commands.h"
#include "trainguard/status.h"

namespace trainguard {

// What the user wrote, before resolution.
struct TorchrunOptions {
  std::string nnodes = "1";          // N or MIN:MAX
  std::string nproc_per_node = "1";  // N, auto, cpu or gpu
  int node_rank = -1;                // -1: not given
  bool standalone = false;
  std::string rdzv_backend;
  std::string rdzv_endpoint;
  std::string rdzv_id;
  std::string rdzv_conf;
  double monitor_interval = -1;
  std::string master_addr;
  int master_port = -1;
  std::string role;
  std::string log_dir;
  std::string redirects;
  std::string tee;
  std::string local_ranks_filter;
  bool no_python = false;
  bool module = false;
  bool run_path = false;
  std::string python;                // --python; else TRAINGUARD_PYTHON; else torchrun's; else python3
};

// Applies `t` to `o` (nnodes, nproc_per_node, command, job id, run dir, extra
// environment) and returns the notes to print; an error if the command line
// asks for something trainguard does not do. `o->command` is the command as
// written (a script, `-m` module, or a program).
StatusOr<std::vector<std::string>> ResolveTorchrunOptions(const TorchrunOptions& t, JobOptions* o);

// The interpreter a script runs under: `requested` if given, else
// TRAINGUARD_PYTHON, else the interpreter of the `torchrun` on PATH if it
// exists, else "python3".
std::string ChoosePython(const std::string& requested);

// GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else /dev/nvidiaN.
int CountGpus();

}  // namespace trainguard
