// JobSnapshot: a copy of what the controller holds of its job at one moment,
// for readers outside it (the HTTP API, /metrics, `trainguard status`). It
// owns its data: taking one holds the controller's mutex only to copy.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "proto/protocol.h"

namespace trainguard {

struct RankSnapshot {
  int rank = -1;             // global rank
  int local_rank = -1;
  std::string node;
  int pid = 0;
  bool running = false;
  bool attached = false;     // the rank's client is in (instrumented)
  std::int64_t step = -1;    // -1 before its first step
  std::int64_t step_count = 0;
  std::string phase;
  std::int64_t phase_age_ms = 0;
  std::int64_t progress_age_ms = 0;  // since its newest step (or its launch)
  std::int64_t checkpoint_step = -1;
  std::int64_t first_step_unix_ms = 0;
  std::int64_t last_step_unix_ms = 0;
  std::string waiting_in;    // the collective it is in ("all_reduce on group 0"), "" if none
  std::int64_t waiting_ms = 0;
};

struct NodeSnapshot {
  std::string node_id;
  int group_rank = -1;       // -1: an idle spare, or out of the job
  bool connected = false;
  std::string role;          // "member", "spare" (idle, connected), "away" (holds a rank, not connected), "out"
  std::string address;
  std::string rack;
  double heartbeat_age_s = -1;  // -1: no heartbeat yet
  bool straggler = false;    // the straggler detector names it now
  int standbys_ready = 0;    // warm standby ranks waiting on it (docs/restart.md)
  std::int64_t standby_rss_kb = 0;
  std::int64_t memory_checkpoint_bytes = 0;  // the node's memory copies of checkpoints
  // Its running ranks' storage I/O (process groups, DataLoader workers
  // included; cumulative since each process started) and the tasks blocked
  // now in a file system call, by mount point ("" unknown).
  std::int64_t read_bytes = 0, write_bytes = 0, read_calls = 0, write_calls = 0;
  std::int64_t files_opened = 0;  // by its instrumented ranks' Python code (metadata rate)
  std::map<std::string, int> blocked_by_mount;
  std::vector<v1::GpuHealth> gpus;  // its GPUs at its latest heartbeat
  std::vector<v1::MountIo> mounts;  // its storage mounts' counters at its latest heartbeat
  double tcp_retrans_pct = -1;      // share of TCP segments retransmitted since the heartbeat before
  double link_errors_per_s = -1;    // its links' drops and errors per second
};

struct JobSnapshot {
  std::string job_id;
  std::string state;         // JobStateName
  bool finished = false;
  int nnodes = 0;            // the job's size (MAX of an elastic job)
  int active_nnodes = 0;     // nodes of the running generation
  int nproc_per_node = 0;
  int max_restarts = 0;
  int restart_count = 0;
  std::int64_t generation = -1;
  std::int64_t generation_first_step_unix_ms = 0;  // the running generation's first step, 0 if none yet
  std::int64_t generation_first_step = -1;         // its number
  std::int64_t max_step = -1;         // the newest step any rank reported
  std::int64_t checkpoint_step = -1;  // the newest committed checkpoint
  double checkpoint_overhead_ms = 0;  // of the running generation
  double checkpoint_wait_ms = 0;      // of it, waiting for the previous save's write
  double data_wait_ms = 0;            // the running generation's steps' longest waits for data
  std::int64_t checkpoint_saves = 0;  // rank 0's saves (trainguard.Checkpointer), all generations
  // Steps per second of the running generation: of the slowest rank, from
  // its first step to its newest (0 if unknown).
  double step_rate = 0;
  std::int64_t newest_step_unix_ms = 0;  // of the running generation, 0 if none (as of the last heartbeats)
  Nanos heartbeat_interval = 0;
  bool incident_open = false;
  int incidents = 0;
  std::int64_t store_errors = 0;  // failed reads and failed write attempts of the store
  // The store writer (store/store_writer.h): writes waiting now, attempts
  // retried, writes given up (the store refused them as wrong), callers that
  // waited on a full queue, timing batches dropped, whether the store takes
  // writes now, and how long the oldest waiting write has waited.
  std::int64_t store_queued = 0;
  std::int64_t store_retries = 0;
  std::int64_t store_given_up = 0;
  std::int64_t store_backpressure_waits = 0;
  std::int64_t store_over_limit = 0;  // writes queued beyond the queue's limit (the store away long)
  std::int64_t store_timings_dropped = 0;
  bool store_unavailable = false;
  double store_oldest_queued_s = 0;
  std::string last_failure;  // one line, "" if none
  std::string summary;       // the final summary once finished
  Nanos now_wall = 0;
  std::vector<NodeSnapshot> nodes;  // by node id
  std::vector<RankSnapshot> ranks;  // by rank
};

}  // namespace trainguard
