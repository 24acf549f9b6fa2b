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
  // Checkpoint tiers (docs/checkpoint_policy.md). "fixed": saves every
  // memory_interval_s to node memory (and the peer's) and every
  // checkpoint_interval_s to storage (memory_interval_s 0: every save goes
  // to storage, as a script with one interval does); "auto": the intervals
  // the controller's checkpoint plan sends.
  std::string checkpoint_policy = "fixed";
  double memory_interval_s = 0;
  // A save's write to storage after it blocked: restorable from storage once
  // written. Assumed: a node's 64 GiB (8 ranks of 8 GiB) at 1 GB/s — Llama 3's
  // 2 TB/s file system (arXiv:2407.21783) shared by 2,048 nodes.
  double persist_s = 64;
  // A save's push to the peer node's memory: 64 GiB at 50 GB/s (one 400 Gb/s NIC).
  double peer_copy_s = 1.3;
  // Of the hosts lost, the share that take their peer (the node its copies
  // go to) with them: a rack, switch or power event spanning both. Assumed
  // 2 %: peers sit in other racks; Llama 3's switch, cable and power faults
  // were 9 % of its interruptions, few of them spanning racks.
  double peer_loss_fraction = 0.02;
  // Reading the checkpoint back, added to the restart: from node memory
  // (8 GiB per rank over PCIe at 25 GB/s) or from storage (every node's
  // 64 GiB at 1 GB/s, as written).
  double restore_memory_s = 0.32;
  double restore_storage_s = 64;
  // Recovery costs.
  double shutdown_s = 0.128;  // measured: Stop -> every rank stopped (bench/recovery_bench.py)
  double restart_s = 3.52;    // measured: launch -> first step of a 4-rank job (bench/recovery_bench.py); at scale, minutes
  // The restart's terms that grow with the job, added to restart_s (0: not
  // modelled; docs/simulator.md gives published figures for each):
  double import_s_per_node = 0;     // imports from a shared file system without a cache
  double store_s_per_rank = 0;      // the rendezvous store's set-up (TCPStore)
  double nccl_init_s_per_rank = 0;  // NCCL's communicator set-up on its default path
  // Silent corruption (docs/sdc.md): the ranks' parameter fingerprints,
  // taken every `fingerprint_every` steps (0: off; the instrumentation's
  // choice at 5 s steps is every step), are compared among data-parallel
  // replicas. Each `model_parallel` consecutive ranks (TP x PP x CP) hold
  // one copy of the model between them; 0: one node's GPUs (tensor
  // parallel within the node). Equal to gpus: no replicas (FSDP over the
  // whole job), nothing to compare.
  int fingerprint_every = 1;
  int model_parallel = 0;
  double diagnose_s = 2.12;   // measured: the quick suite on one node (bench/diag_bench.py)
  std::string diagnose = "off";
  int spares = 0;              // hot spares registered with the job
  double replacement_s = 300;  // the scheduler brings a node; < 0: never (assumed 5 min)
  int pool = -1;               // nodes the scheduler can bring before repairs return some; -1: unlimited
  // Detection knobs (JobConfig's defaults).
  double hang_timeout_s = 300;
  // What a straggler gets (the failure model's stragglers): "report" (an
  // event, the job goes on at its pace) or "evict" (the node is replaced
  // once the detector has seen it slow long enough; a restart).
  std::string straggler_action = "report";
  double heartbeat_interval_s = 1;
  int missed_heartbeats = 5;
  double rendezvous_timeout_s = 0;  // 0: max(300 s, 2 x replacement_s)
  int max_restarts = -1;            // -1: unlimited
  int no_progress_restarts = 3;

  int ModelParallel() const { return model_parallel > 0 ? model_parallel : gpus_per_node; }
  // Launch -> first step for `nodes` nodes: restart_s and the terms that grow with the job.
  double LaunchS(int nodes) const {
    return restart_s + import_s_per_node * nodes + (store_s_per_rank + nccl_init_s_per_rank) * gpus;
  }

  // Applies a JSON object's fields over these (unknown fields and wrong
  // types are refused, naming the field).
  Status MergeJson(const std::string& text, const std::string& origin);
  // Whether the values make a simulation (errors name the parameter).
  Status Validate() const;
};

}  // namespace trainguard
