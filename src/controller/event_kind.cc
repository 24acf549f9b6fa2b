#include "controller/event_kind.h"

#include <unordered_map>

namespace trainguard {

const std::vector<EventKindInfo>& EventKinds() {
  static const std::vector<EventKindInfo> table = {
      {EventKind::kJobCreated, "job_created",
       "controller start",
       "the job's configuration; `failure_prior_from` where the checkpoint plan's prior is the fleet's"},
      {EventKind::kNodeRegistered, "node_registered",
       "an agent joins",
       "hostname, address, agent pid, group rank, spare"},
      {EventKind::kAgentRefused, "agent_refused",
       "an agent is refused (protocol, duplicate id, cordoned node, no slot and no spare place)",
       "reason"},
      {EventKind::kGenerationStarted, "generation_started",
       "ranks are (re)launched: recorded (and waited for, up to 200 ms, off the controller's lock) before the agents "
       "are told to start; a generation stopped meanwhile is never started",
       "master address and port, restart count, `group_ranks` (node → group rank)"},
      {EventKind::kWaitingForNodes, "waiting_for_nodes",
       "an elastic job (`--nnodes MIN:MAX`) below MIN waits: which group ranks are empty and why "
       "(docs/nodes.md); said again only when it changes",
       "`empty_group_ranks`, `present`, `min_nnodes`, `max_nnodes`, `idle_spares`"},
      {EventKind::kGroupRanksRenumbered, "group_ranks_renumbered",
       "an elastic job starts on fewer nodes than before: the nodes it has take the group ranks 0..k-1 "
       "(docs/nodes.md)",
       "`moved`: node → [old, new] group rank"},
      {EventKind::kWorldResized, "world_resized",
       "an elastic job runs on another number of nodes than its last generation (docs/nodes.md)",
       "`nnodes`, `previous_nnodes`, `min_nnodes`, `max_nnodes`, `world_size`"},
      {EventKind::kRanksStarted, "ranks_started",
       "an agent spawned its ranks",
       "pids by global rank, generation, the node's group rank, `warm` (ranks a warm standby became), "
       "`cold` (why the others started cold: reason → ranks; [restart.md](restart.md)), `standby_wait_ms` "
       "(ranks whose start waited for a standby still importing: rank → ms), `memory_restore` "
       "when the node came back with no memory copies and fetched its ranks' from the node that held them "
       "(`from_node`, `files`, `bytes`, `ms`, `problem`)"},
      {EventKind::kFirstStep, "first_step",
       "the first `step()` of a generation",
       "its Unix time, time since launch, `warm`, `resumed_step` (the checkpoint the rank says it restored)"},
      {EventKind::kReplicaSets, "replica_sets",
       "the parameter fingerprints of a generation showed which ranks are replicas (docs/sdc.md)",
       "`generation`, `sets` (each an arithmetic progression of global ranks as `first`, `stride`, `count`, any "
       "other set as its list), `agreed_through` (a restarted controller keeps comparing them from there)"},
      {EventKind::kReplicaDivergence, "replica_divergence",
       "a rank's parameter fingerprint differs from its replicas' (docs/sdc.md); a `failure` of kind "
       "`replica_divergence` follows",
       "`step`, `last_agreed_step`, `replicas` (the set, as in `replica_sets`), `replicas_total`, `diverged` "
       "(empty: two replicas, no majority), `fingerprints` by rank (the diverged ranks' and up to 8 others', 64 "
       "at most), `nodes`, `resume_at_most`; `replay` when the step is replayed to confirm "
       "(two replicas)"},
      {EventKind::kNumericAnomaly, "numeric_anomaly",
       "NaN/Inf in ranks' losses or gradient norms at the first step any rank had one (docs/sdc.md); a "
       "`failure` of kind `numeric_anomaly` follows",
       "`step`, `ranks`, `flagged` (rank: kind, value), `observers` (ranks that check a loss), `all`, "
       "`nodes`, `resume_at_most`, `replay` for a suspicion"},
      {EventKind::kNumericSpike, "numeric_spike",
       "a loss or gradient-norm spike (10x the first 100 values' largest, by default); no action",
       "as `numeric_anomaly`, `spike` true"},
      {EventKind::kSdcConfirmation, "sdc_confirmation",
       "a suspicion's replay decided (docs/sdc.md, \"Confirmation by replay\")",
       "`result` (not reproduced, reproduced, confirmed), `persistence`, `what` (numeric, disagreement), "
       "`step`, `suspects`, `culprit_ranks`, `nodes`, `replay_fingerprints`, `returned`"},
      {EventKind::kSdcSuspicion, "sdc_suspicion",
       "the suspicion being confirmed by replay changed: set, its suspect node moved out, or decided "
       "(docs/sdc.md); a restarted controller or a new leader goes on with the last one",
       "`what` (numeric, disagreement; empty: none), `stage` (0 none, 1 replay on the same nodes, 2 without "
       "`moved`), `step`, `last_agreed_step`, `ranks`, `values` (the first fingerprints by rank), `nodes`, "
       "`moved`, `devices`, `from_generation`"},
      {EventKind::kNodeReturned, "node_returned",
       "a node moved out to confirm a suspicion was innocent: uncordoned",
       "`reason`, `by`"},
      {EventKind::kCheckpointVerified, "checkpoint_verified",
       "a committed checkpoint's state was verified: the replicas agreed at or after its step and no rank "
       "had a NaN/Inf through it (docs/sdc.md); retention keeps it",
       "`step`, `verified_through`, `replicas_agreed_through` (null: no replicas to compare), "
       "`clean_through`, `generation`"},
      {EventKind::kResumeBoundCleared, "resume_bound_cleared",
       "a generation after a rollback committed a checkpoint past every step the bad state reached: "
       "restarts resume from the newest again (docs/sdc.md)",
       "`resume_at_most`, `bad_through`, `committed`"},
      {EventKind::kTorchCheckpointDir, "torch_checkpoint_dir",
       "a directory the script writes its own torch.save training checkpoints to, first seen (set aside on "
       "a rollback)",
       "`dir`"},
      {EventKind::kCheckpointCommitted, "checkpoint_committed",
       "a newer `checkpoint_committed(step)`",
       ""},
      {EventKind::kCheckpointPlan, "checkpoint_plan",
       "the checkpoint intervals the controller told the ranks: the first plan, then each that differs by 10 % "
       "or more (docs/checkpoint_policy.md)",
       "`memory_interval_s` (0: no memory tier), `storage_interval_s`, `job_mtbf_s`, `storage_mtbf_s`, "
       "`save_cost_s`, `saves`, `expected_overhead`"},
      {EventKind::kRankExited, "rank_exited",
       "any rank exit the agent reaped",
       "exit code, signal, step, phase, last output lines"},
      {EventKind::kFailure, "failure",
       "a failure was detected (one per incident)",
       "`failure_kind` (rank_failed, hang, node_lost, fatal_line, straggler, link_flapping, "
       "replica_divergence, numeric_anomaly: `FindingKind`, controller/finding.h), fault and detection "
       "time, failure step, checkpoint step (the newest committed when it was detected: a save may commit "
       "before the stop, and the `downtime` event's `resumed_step` is what the restart resumed from), "
       "evidence; the generation's `checkpoint_overhead_ms`, "
       "`checkpoint_wait_ms` and `data_wait_ms`; `error_file` for a rank that left one"},
      {EventKind::kLogAlert, "log_alert",
       "an agent saw a line matching a rule with a `scan` severity",
       "rule, severity (fatal: a failure follows; warning: the node is marked `watch` if the rule is a "
       "hardware one), the line"},
      {EventKind::kStacks, "stacks",
       "stacks of a hung rank",
       "process state, Python stacks (faulthandler), native (gdb, with `--native-stacks`)"},
      {EventKind::kRankUnkillable, "rank_unkillable",
       "a rank outlived SIGKILL at the stop: in uninterruptible sleep, waiting in the kernel for a call that did not "
       "return",
       "pid, process state, the kernel function it sleeps in (wchan), the system call"},
      {EventKind::kNodeLost, "node_lost",
       "missed heartbeats (counted from the transport's arrival stamps: a busy controller does not make a "
       "node silent), closed connection, or no stop report",
       "reason"},
      {EventKind::kControllerStalled, "controller_stalled",
       "the controller itself did not run for over 1 s (ticks further apart: its process was frozen or "
       "starved); every node's silence is counted afresh from then",
       "`gap_ms`"},
      {EventKind::kStopped, "stopped",
       "every rank of the failed generation stopped",
       "shutdown time"},
      {EventKind::kRestarting, "restarting",
       "a restart begins",
       ""},
      {EventKind::kDowntime, "downtime",
       "the next generation's first step (or the job's end)",
       "see below"},
      {EventKind::kAttribution, "attribution",
       "all ranks of the failed generation stopped, and the blame, computed off the controller's lock, is "
       "back (for a lost node, after the scheduler said why, at most 10 s)",
       "`failure_kind` (as in `failure`), category, hardware, persistence, culprits (`culprit_ranks`, "
       "`culprit_nodes`: exactly the culprit "
       "ranks' nodes, and `culprit_evidence`: why them, or why no rank is named; docs/detection.md), "
       "evidence, confidence (calibrated), `answered_by` (rules, model or none), `model` (the learned "
       "model's reading when consulted: category, probability, deciding features), recommended action, "
       "decision, and `culprit_error_file` when the culprit rank had raised but was still exiting as the "
       "incident stopped it (its error file came with the stop: the root cause's, docs/attribution.md)"},
      {EventKind::kDecision, "decision",
       "with the attribution",
       "restart, evict_node or stop, and why; `policy`: the recovery policy's memory after it (incident "
       "signatures, best failure step, incidents without progress), which a restarted controller loads"},
      {EventKind::kNodeEvicted, "node_evicted",
       "a culprit node is evicted (and cordoned), or a node cordoned during the job leaves it at the restart",
       "reason, by (the controller of the job), group rank, evidence (the attribution it rests on)"},
      {EventKind::kSparePromoted, "spare_promoted",
       "an idle spare takes an empty group rank at a restart",
       "group rank, idle spares left"},
      {EventKind::kDiagnosisStarted, "diagnosis_started",
       "a diagnosis round begins: before the first start, or after a failure with every rank stopped "
       "(`--diagnose`, docs/nodes.md)",
       "`round`, `purpose`, `nodes`, `mode`"},
      {EventKind::kDiagnostics, "diagnostics",
       "one node's answer in a diagnosis round, per stage",
       "`round`, `wall_ms`, `stage` (suite, all-to-all, rack all-reduce), `figures`"},
      {EventKind::kDiagnosisConfirming, "diagnosis_confirming",
       "a node whose failures are all measured speeds is diagnosed again before it is evicted",
       "`round`, `nodes`"},
      {EventKind::kDiagnosis, "diagnosis",
       "a diagnosis round ended: each node passed or failed; failing ones are evicted and cordoned",
       "`round`, `purpose`, `nodes` (each with its verdict), `evicted`"},
      {EventKind::kLinkDown, "link_down",
       "a node's link lost its carrier (from the heartbeat's link counters; docs/nodes.md, \"Link health\")",
       "`link`"},
      {EventKind::kLinkUp, "link_up",
       "a node's link has its carrier again",
       "`link`"},
      {EventKind::kLinkFlap, "link_flap",
       "a link lost its carrier and came back, counted in the flap window",
       "`link`, `flaps_in_window`"},
      {EventKind::kLinkFlapping, "link_flapping",
       "a node's links flapped `--link-flaps-to-evict` times in `--link-flap-window`: the node fails the "
       "generation and is evicted",
       "`link`, `flaps_in_window`"},
      {EventKind::kLinkSilent, "link_silent",
       "a node moved no bytes on any link for 10 s while the other nodes moved at least 10 kB/s (recorded; "
       "the hang detector decides)",
       ""},
      {EventKind::kStraggler, "straggler",
       "a node (or rank) was slow for 3 windows of steps, or at once by the step-by-step test, and again "
       "when it became evictable (docs/telemetry.md)",
       "`unit` (the node, or `NODE/rank N` in jobs of fewer than 3 nodes), signal (compute, communication "
       "or data), phase, slowdown, steps, first and last step, value and centre (µs per step), "
       "last_to_enter (share of its collectives it entered last, -1 if none journaled), evict, action, "
       "cause (what the node's telemetry shows against the other nodes': a GPU held down by a throttle "
       "reason, CPU throttling or steal, TCP retransmissions; a data straggler's loader or storage; "
       "\"unknown\" if nothing stands out, with `cause_looked_at`), measure (a compute straggler named "
       "step by step: `time` or `cpu_time`)"},
      {EventKind::kGpuErrors, "gpu_errors",
       "a node's heartbeat shows a GPU's uncorrected ECC errors, pending or failed row remaps grown since "
       "its previous one (docs/telemetry.md, \"GPU health\"); also kept with the node as a `gpu-errors` "
       "node action",
       "increases (\"GPU 1: uncorrected ECC errors 0 -> 2\")"},
      {EventKind::kStragglerCleared, "straggler_cleared",
       "a reported straggler kept pace for 3 windows after the step it was named at",
       "`unit`, signal, first and last step of the windows that kept pace"},
      {EventKind::kStragglerBaseline, "straggler_baseline",
       "once per generation, when the straggler detector learned its baselines from the generation's own "
       "steps (after a restart, a spare's promotion or a warm start, nothing before them is compared)",
       "first and last step of the baseline"},
      {EventKind::kSlowTrend, "slow_trend",
       "the job's step time grew 8 % over its baseline for 5 windows",
       "slowdown, phase, steps"},
      {EventKind::kLayout, "layout",
       "once per generation, when every rank reported its groups",
       "layout dims, each rank's coordinates (the trace orders ranks by them)"},
      {EventKind::kTimingsDropped, "timings_dropped",
       "a node's timing rings lost records",
       "dropped (cumulative this generation)"},
      {EventKind::kSpareLost, "spare_lost",
       "an idle spare's agent went away (no failure: it held no ranks); the scheduler backend is asked for another",
       ""},
      {EventKind::kNodeReassigned, "node_reassigned",
       "before the first start, a node that asked for a group rank takes it from one that had taken it as "
       "the lowest free",
       "its new group rank, or spare"},
      {EventKind::kNodeSuspect, "node_suspect",
       "a node marked suspect by an earlier job registers",
       "reason, the job that marked it"},
      {EventKind::kControllerRestarted, "controller_restarted",
       "a controller started on the store of a job that had not ended (its controller died)",
       "previous state, generation, restart count, the last event's time, reconnect window, the "
       "generation's nodes and group ranks"},
      {EventKind::kNodeReconnected, "node_reconnected",
       "after a controller restart, a node of the running generation is back with its ranks",
       "hostname, address, agent pid, group rank, pids by global rank"},
      {EventKind::kJobResumed, "job_resumed",
       "every node of the running generation is back: the job goes on without a restart",
       "generation"},
      {EventKind::kState, "state",
       "every state change",
       "from, to"},
      {EventKind::kJobSucceeded, "job_succeeded",
       "the end: every rank exited 0",
       "restart count, `last_step_unix_ms`, the last generation's `checkpoint_overhead_ms`, "
       "`checkpoint_wait_ms` and `data_wait_ms`; `checkpoint_saves`, rank 0's saves (trainguard.Checkpointer) in "
       "all generations"},
      {EventKind::kJobFailed, "job_failed",
       "the end: a failure the policy stops on, the restart limit, a cancel",
       "as `job_succeeded`"},
  };
  return table;
}

const char* EventKindName(EventKind kind) { return EventKinds()[static_cast<std::size_t>(kind)].name; }

std::optional<EventKind> EventKindFromName(std::string_view name) {
  static const std::unordered_map<std::string_view, EventKind> by_name = [] {
    std::unordered_map<std::string_view, EventKind> m;
    for (const auto& k : EventKinds()) m.emplace(k.name, k.kind);
    return m;
  }();
  auto it = by_name.find(name);
  if (it == by_name.end()) return std::nullopt;
  return it->second;
}

std::string EventKindsMarkdown() {
  std::string s = "| kind | when | detail |\n|---|---|---|\n";
  for (const auto& k : EventKinds()) s += std::string("| ") + k.name + " | " + k.when + " | " + k.detail + " |\n";
  return s;
}

}  // namespace trainguard
