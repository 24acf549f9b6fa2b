// SimParams: the job and the costs a simulation runs with. Every cost has a
// default measured by this project's benchmarks where one exists (named
// beside it); the rest are assumptions a user should replace with their
// fleet's figures. Loaded from a JSON file (`trainguard sim --params`),
// flags override it.
#pragma once

#include <cstdint>
#include <string>

#include "trainguard/status.h"

namespace trainguard {

struct SimParams {
  int gpus = 16384;
  int gpus_per_node = 0;  // 0: the failure model's
  double days = 30;
  std::uint64_t seed = 1;
  // The training job.
  double step_s = 5;                    // one step, assumed
  double checkpoint_interval_s = 1800;  // assumed; trainguard's saves block briefly, so it can be short
  double checkpoint_blocked_s = 0.159;  // measured: an 8 GiB rank's save on an H200 (README, checkpoint table)
  // Recovery costs.
  double shutdown_s = 0.128;  // measured: Stop -> every rank stopped (bench/recovery_bench.py)
  double restart_s = 3.52;    // measured: launch -> first step of a 4-rank job (bench/recovery_bench.py); at scale, minutes
  double diagnose_s = 2.12;   // measured: the quick suite on one node (bench/diag_bench.py)
  std::string diagnose = "off";
  int spares = 0;              // hot spares registered with the job
  double replacement_s = 300;  // the scheduler brings a node; < 0: never (assumed 5 min)
  int pool = -1;               // nodes the scheduler can bring before repairs return some; -1: unlimited
  // Detection knobs (JobConfig's defaults).
  double hang_timeout_s = 300;
  double heartbeat_interval_s = 1;
  int missed_heartbeats = 5;
  double rendezvous_timeout_s = 0;  // 0: max(300 s, 2 x replacement_s)
  int max_restarts = -1;            // -1: unlimited
  int no_progress_restarts = 3;

  // Applies a JSON object's fields over these (unknown fields and wrong
  // types are refused, naming the field).
  Status MergeJson(const std::string& text, const std::string& origin);
  // Whether the values make a simulation (errors name the parameter).
  Status Validate() const;
};

}  // namespace trainguard
