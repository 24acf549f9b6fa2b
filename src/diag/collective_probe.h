// The collective stage of the diagnostics suite: runs the job's Python on
// python/trainguard/_collective_probe.py (torch.distributed over gloo) for an
// all-to-all among the node's local ranks and an all-reduce with its rack,
// and turns what it prints into figures:
//   alltoall_gbps        bus bandwidth of the node's all-to-all; a chunk
//                        that arrives wrong is an error naming its sender
//   rack_allreduce_gbps  bus bandwidth of the rack's all-reduce (the same
//                        collective for every node of the rack: shown, it
//                        does not fail a node by itself)
//   gpu_gemm_tflops:I, gpu_h2d_gbps:I, gpu_d2h_gbps:I
//                        with `gpu`: half-precision GEMM and pinned copies
//                        per CUDA device, timed with CUDA events
//   collective_probe     only when the probe could not run (no torch, a
//                        crash, the deadline): an error, shown, not judged
// The process runs in a process group of its own and is killed with it at
// the deadline (diag/run_program.h).
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "diag/probes.h"

namespace trainguard {

struct CollectivePlan {
  std::string python = "python3";  // an interpreter that can import torch
  std::string script;              // path of _collective_probe.py
  std::string work_dir;            // the all-to-all's FileStore goes here
  int local_ranks = 1;             // < 2: no all-to-all
  bool gpu = false;                // GEMM and host<->device copies of every visible GPU
  bool nccl = false;               // collectives on NCCL when a GPU is there (else gloo)
  int rack_rank = -1;
  int rack_size = 0;               // < 2: no all-reduce
  std::string rack_master;         // HOST:PORT of the all-reduce's rendezvous
  std::int64_t bytes = 4ll << 20;
  int iters = 10;                  // timed runs after a warm-up; the fastest counts
  Nanos timeout = 30 * kSecond;    // each collective's
  Nanos grace = 15 * kSecond;      // the process is killed at timeout + grace
};

std::vector<Figure> RunCollectiveProbe(const CollectivePlan& plan);

// What the probe printed (one JSON object), as figures. Exposed for tests.
std::vector<Figure> CollectiveFiguresFromOutput(const std::string& stdout_text);

}  // namespace trainguard
