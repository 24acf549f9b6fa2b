// JobConfig: the tunables of one job, shared by the controller, its detectors
// and its recovery policy.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/straggler_detector.h"

namespace trainguard {

// The node diagnostics a job orders: none, or the suite's mode.
enum class DiagnoseMode { kOff, kQuick, kFull };
// "off", "quick", "full": the flag's words, the RunDiagnostics order's mode.
constexpr const char* DiagnoseModeName(DiagnoseMode m) {
  return m == DiagnoseMode::kQuick ? "quick" : m == DiagnoseMode::kFull ? "full" : "off";
}

// What a straggler node gets: an event, or also its eviction.
enum class StragglerAction { kReport, kEvict };
// "report", "evict".
constexpr const char* StragglerActionName(StragglerAction a) {
  return a == StragglerAction::kEvict ? "evict" : "report";
}

// Worst-case detection times that follow from these are in docs/detection.md.
struct JobConfig {
  std::string job_id;
  // The job's nodes: nnodes, or as few as min_nnodes (torchrun's --nnodes
  // MIN:MAX; 0 = nnodes) when a group rank stays empty after a failure: an
  // evicted node with no spare and no replacement coming, or nobody joining
  // within elastic_wait. Group ranks are then renumbered 0..k-1.
  int nnodes = 1;
  int min_nnodes = 0;
  Nanos elastic_wait = 30 * kSecond;
  int nproc_per_node = 1;
  std::vector<std::string> argv;
  // Where the controller's HTTP API serves the job (http://HOST:PORT), "" if
  // off: kept with the job so that `trainguard status` finds it.
  std::string api_url;
  // After a restart of the controller (Resume): how long it waits for the
  // running generation's agents to come back with their ranks.
  Nanos reconnect_window = 60 * kSecond;
  // Agents must register with this secret ("" = agents are not checked).
  std::string agent_secret;
  std::map<std::string, std::string> env;  // extra environment for every rank
  // Restarts allowed after the first launch; the job fails on the failure after that.
  int max_restarts = 3;
  // Extra agents the job accepts beyond nnodes: they register, wait idle and
  // take the group rank of an evicted or lost node at the next restart.
  int spares = 0;
  // Launch ranks with torchrun's environment only (no automatic instrumentation).
  bool no_instrument = false;
  // Start ranks cold every time: no warm standbys (docs/restart.md).
  bool no_warm = false;
  // Committed checkpoints each node keeps in memory per rank (0: none).
  int memory_checkpoints = 1;
  // The checkpoint plan (docs/checkpoint_policy.md): the failure rate
  // assumed before the job has seen any (per GPU-hour: Meta RSC-1's 6.50
  // failures per 1000 node-days of 8 GPUs, arXiv:2410.21680), worth
  // failure_prior_weight failures; the share of failures assumed to lose a
  // shard's both memory copies; what a save is assumed to block until one
  // is measured; and how fast each tier can write (its minimum interval).
  double failure_prior_per_gpu_hour = 6.50 / (1000.0 * 24 * 8);
  bool failure_prior_given = false;  // --failure-prior was given: the fleet's history does not replace it
  double failure_prior_weight = 3;
  double storage_loss_prior_share = 0.02;
  double checkpoint_cost_prior_s = 0.159;
  double memory_tier_min_interval_s = 2;
  double storage_tier_min_interval_s = 30;
  // How often the nodes' health is read again from the store (cordons an
  // operator made meanwhile, other jobs' verdicts).
  Nanos health_refresh = 5 * kSecond;
  // How often agents send a heartbeat.
  Nanos heartbeat_interval = 1 * kSecond;
  // A node is lost after this many heartbeat intervals without one.
  int missed_heartbeats = 5;
  // Ticks further apart than this mean the controller itself did not run
  // (its process was frozen or starved): silence is then counted afresh
  // from that Tick, never blamed on the nodes. The daemon, which ticks
  // every 50 ms, sets 1 s; 0 (tests that leap a fake clock): off.
  Nanos watch_gap_grace = 0;
  // A rank whose step has not advanced for this long is hung.
  Nanos hang_timeout = 300 * kSecond;
  // --hang-timeout auto: the timeout is hang_timeout_multiple x the slowest
  // step any rank has made, at least hang_timeout_floor; until a rank has
  // made two steps, startup_timeout applies.
  bool hang_timeout_auto = false;
  int hang_timeout_multiple = 10;
  Nanos hang_timeout_floor = 60 * kSecond;
  // Allowance before a rank's first step (imports, data loading, rendezvous).
  Nanos startup_timeout = 600 * kSecond;
  // SIGTERM to SIGKILL when agents stop ranks.
  Nanos stop_grace = 5 * kSecond;
  // How long agents get to report their ranks stopped before they count as lost.
  Nanos stop_timeout = 30 * kSecond;
  // How long the job waits for all nodes to (re)join before it fails.
  Nanos rendezvous_timeout = 300 * kSecond;
  // Restart-storm guard: stop after this many incidents in a row in which
  // the job made no step beyond the previous failure.
  int no_progress_restarts = 3;
  // The calibrated confidence (docs/attribution.md) from which the
  // attribution's own recommendation (evict the node, stop a deterministic
  // failure) is acted on; below it the job restarts. Evictions that rest on
  // the node's history, a diagnostic or a detector's measurement are not held
  // to it. docs/attribution.md ("Acting on confidence, measured") has the
  // precision at each threshold on logs newer than anything fitted.
  double min_confidence = 0.7;
  // Node diagnostics the controller orders (controller/diagnosis_round.h):
  // off, or the suite's mode (quick, full), run on every node before the
  // first start and after every failure with all ranks stopped; nodes that
  // fail are evicted and cordoned.
  DiagnoseMode diagnose = DiagnoseMode::kOff;
  std::vector<std::string> diag_paths;  // ROLE=DIR for the disk probes; none: each agent's run dir
  int diag_parallelism = 0;             // nodes diagnosed at once, 0 = all (1 when nodes share a host)
  Nanos diag_timeout = 60 * kSecond;    // a node that has not answered by then fails
  // A node whose links lose their carrier this many times within
  // link_flap_window is failed and evicted (controller/link_monitor.h).
  int link_flaps_to_evict = 3;
  Nanos link_flap_window = 600 * kSecond;
  // Hardware incidents of a node count against it (evicting it on vague
  // failures) for this long, unless an operator cleared it since.
  Nanos suspicion_window = 7 * 24 * 3600 * kSecond;
  // Stragglers (controller/straggler_detector.h): kReport records them;
  // kEvict also takes a node out (diagnose, evict, spare) once it has been
  // slow for straggler.windows_to_evict windows.
  StragglerAction straggler_action = StragglerAction::kReport;
  StragglerPolicy straggler;
  // Each node's clock offset is probed this often (controller/clock_sync.h).
  Nanos clock_probe_interval = 2 * kSecond;
  // Step timings in the store: the newest timing_detail_steps steps keep
  // every interval (the trace); older ones keep their per-phase totals, one
  // step in timing_keep_every (the heatmap's windows, trends).
  std::int64_t timing_detail_steps = 2000;
  int timing_keep_every = 10;
  // GPU series in the store: one row per GPU per interval (0: none); rows
  // older than an hour are thinned to one per 10 minutes.
  Nanos gpu_series_interval = 30 * kSecond;
  // This controller's lead of the job (controller/leadership.h): stamped on
  // every message to an agent, which acts on none below the highest it saw
  // (0: a controller without standbys). Not a knob: the store grants it.
  std::int64_t lead_epoch = 0;
  // How long a new generation's Start waits for its generation_started
  // event to be in the store (then it goes anyway, and the event follows;
  // docs/events.md, "what is durable when"). Not a knob: tests set it.
  Nanos start_record_wait = 200 * kMillisecond;
};

}  // namespace trainguard
