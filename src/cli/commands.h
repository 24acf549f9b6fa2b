// The `trainguard` subcommands. main.cc parses flags into these option
// structs and calls one function; each returns the process exit code.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/job_config.h"

namespace trainguard {

struct JobOptions {
  // The job's knobs (restarts, timeouts, detectors, diagnostics), set by
  // their flags from the one table of controller/job_knobs.h.
  JobConfig knobs;
  int nnodes = 1;           // the most nodes (MAX of --nnodes MIN:MAX)
  int min_nnodes = 0;       // the fewest the job goes on with; 0 = nnodes
  int nproc_per_node = 1;
  std::string scheduler = "local";  // run: "local" (every node on this host) or "slurm" (the allocation's nodes)
  bool netns = false;       // run: every node in a network namespace of its own (root)
  bool netns_fallback = false;  // run --netns without root or namespaces: shared network, with a note
  int nodes_per_rack = 0;   // run: node<N> is in rack<N / nodes_per_rack> (its own bridge with --netns); 0 = no racks
  std::string http = "127.0.0.1:0";  // the HTTP API's HOST:PORT, "off" for none (docs/api.md)
  std::string secret_file;          // the job's secret for agents and API actions; "" = a new one in <run_dir>/job-secret
  std::string tls_cert, tls_key;    // TLS for the agents' stream (PEM files); "" = none
  std::string tls_ca;               // what this host's agents trust; "" = tls_cert (self-signed)
  double store_drain_timeout_s = 120;  // at the end: how long queued writes wait for a store that is away
  std::vector<std::string> alert_webhooks;  // JSON POSTs of incidents, decisions, evictions, the end (docs/alerts.md)
  std::vector<std::string> diag_paths;  // ROLE=DIR for the disk probes
  int diag_parallel = -1;               // nodes diagnosed at once; -1: 1 when `run` has every node here, else all
  std::string store = "trainguard.db";
  std::string job_id;       // "" = generated
  std::string run_dir;      // "" = <DefaultRunDirBase()>/<job_id>
  bool native_stacks = false;
  std::vector<std::string> extra_rules;  // attribution rules merged over the shipped ones
  std::vector<std::string> command;
  std::map<std::string, std::string> env;  // extra environment for every rank
  bool dry_run = false;     // print the resolved job as JSON and exit
  // One host of several (torchrun's multi-node command line): the rendezvous
  // HOST:PORT every host names. The host that owns it and binds it first runs
  // the controller and an agent; the others join as agents. "" = every node
  // of the job is an agent on this host.
  std::string rendezvous;
  int node_rank = -1;       // this host's preferred group rank, -1 = any
  std::string node_id;      // this host's node id when the job spans hosts ("" = hostname)
};

struct ControllerOptions {
  JobOptions job;
  std::string listen = "0.0.0.0:29400";
};

struct AgentOptions {
  std::string controller;   // HOST:PORT
  std::string node_id;      // "" = hostname
  std::string address;      // "" = derived from the controller address
  std::string run_dir;      // "" = <run_dir_base>/<node_id>
  std::string run_dir_base;  // "" = DefaultRunDirBase()
  int group_rank = -1;      // preferred group rank, -1 = any
  std::string rack;         // "" = $TRAINGUARD_RACK, else none
  double connect_timeout_s = 10;
  bool native_stacks = false;
  bool quiet = false;
  std::string secret_file;        // the job's secret ("" = $TRAINGUARD_SECRET_FILE, else none)
  std::string tls_ca;             // connect over TLS, trusting these certificates (PEM); "" = no TLS
  double reconnect_window_s = 60; // when the controller is gone: keep the ranks and reconnect this long; 0 = exit
  unsigned protocol_version = 0;  // 0 = ours; tests set another to check refusal
  bool exit_with_job = false;     // exit with the job's exit status, not 0, when it ends
};

struct EventsOptions {
  std::string store = "trainguard.db";
  std::string job_id;       // "" = the newest job
  bool json = false;
  bool fleet = false;       // report: every job in the store, not one
};

struct StatusCommandOptions {
  EventsOptions stored;
  std::string url;          // the controller's API; "" = where the job's record says
  bool watch = false;       // refresh until the job ends
  double interval_s = 2;
};

struct HangOptions {
  EventsOptions stored;
  int incident = 0;         // 0 = the newest hang
};

struct TraceOptions {
  EventsOptions stored;
  std::string steps;        // "A:B", "A:" or "" (all)
  std::string out;          // -o FILE.json
};

struct HeatmapCommandOptions {
  EventsOptions stored;
  std::string phase;        // "" = every phase
  bool ranks = false;
  std::int64_t window = 0;
  std::string gpu;          // a figure of the GPU series: rows are GPUs, columns windows of time
  std::string out;          // -o FILE.svg | FILE.html
};

struct CkptOptions {
  std::string dir;
  std::int64_t step = -1;   // verify: -1 = every step
  bool json = false;
};

struct AttributeOptions {
  std::vector<std::string> files;        // one rank's log each ("-" = stdin)
  std::vector<std::string> extra_rules;  // merged over the shipped rules
  bool json = false;
  bool features = false;  // print the model's features of the log instead (training)
  bool no_model = false;  // rules alone
  bool each = false;      // every file a log of its own: a JSON line each, in order (a corpus, at once)
};

struct DiagOptions {
  std::string store;                   // "" = record nothing (--no-store)
  std::string node_id;                 // "" = hostname
  std::vector<std::string> paths;      // ROLE=DIR; none = scratch=$TMPDIR or /tmp
  bool full = false;                   // the full suite (longer probes), else the quick one
  bool show = false;                   // judge the stored diagnostics; measure nothing
  bool json = false;
  double max_age_s = 24 * 3600;        // older records are not compared
  std::vector<std::string> floors;     // KIND=VALUE over the default floors
  std::vector<std::string> fractions;  // KIND=FRACTION over the default fractions of the median
  bool slurm_drain = false;            // a Slurm prolog/epilog: drain (and cordon) a failing or cordoned node
  // The GPUs' GEMM and copies (when the driver lists GPUs): run with this
  // interpreter, which must import torch with CUDA; "" = $TRAINGUARD_PYTHON or python3.
  std::string python;
  bool gpu_compute = true;
};

int RunJob(const JobOptions& options);
// Where the event store lives unless --store says otherwise: a per-user state
// directory ($XDG_STATE_HOME/trainguard, else ~/.local/state/trainguard, else
// /tmp/trainguard-UID), created when needed.
std::string DefaultStorePath();
// Where a job's logs and stacks go unless --run-dir says otherwise, below a
// directory of the job's id: $TMPDIR/trainguard (an absolute $TMPDIR, as a
// batch system sets per job), else /tmp/trainguard.
std::string DefaultRunDirBase();
int AttributeCommand(const AttributeOptions& options);
int ListCheckpointsCommand(const CkptOptions& options);
int VerifyCheckpointsCommand(const CkptOptions& options);
int RunController(const ControllerOptions& options);
int RunAgent(const AgentOptions& options);
int ShowEvents(const EventsOptions& options);
// trainguard report: incidents with attribution, and the downtime accounting.
int ShowReport(const EventsOptions& options);

// trainguard nodes: what the store knows of each node across jobs.
int ShowNodes(const EventsOptions& options);
// trainguard status [JOB]: state, step, step rate, ETTR, restarts, nodes and
// the last incident, live from the controller's API, or from the store.
int ShowStatus(const StatusCommandOptions& o);
// trainguard cordon NODE --reason R: the node gets no ranks in any job until
// uncordoned; the action is kept with who took it.
int CordonNode(const std::string& store, const std::string& node, const std::string& reason);
// trainguard uncordon NODE: returns a cordoned node and clears its
// suspicion; its earlier incidents no longer count against it.
int UncordonNode(const std::string& store, const std::string& node, const std::string& reason);

// trainguard diag: the node diagnostics suite (cli/diag_command.cc).
int DiagCommand(const DiagOptions& options);

// trainguard hang: where the job's hang sat in its parallel layout.
int ShowHang(const HangOptions& options);
int WriteTrace(const TraceOptions& options);
int WriteHeatmap(const HeatmapCommandOptions& options);

// trainguard sim: a simulated job of thousands of nodes run by the real
// controller (cli/sim_command.cc, docs/simulator.md).
struct SimCommandOptions {
  std::string model = "llama3";  // a shipped model's name or a JSON file
  std::string params_file;       // JSON parameters, under the flags
  std::map<std::string, double> set;  // parameters given as flags (name -> value)
  std::string diagnose;          // "" = the params'
  std::string checkpoint_policy;  // "" = the params'
  std::string straggler_action;   // "" = the params'
  std::vector<std::string> sweep;  // NAME=V1,V2,... (each a parameter)
  std::string out = ".";         // where a sweep writes sim-sweep.csv and sim-sweep.svg
  std::string store;             // keep the simulated job's store here ("" = a temporary one)
  bool json = false;
};
int SimCommand(const SimCommandOptions& options);
// trainguard plan: the recommended checkpointing, spares and hang timeout, simulated.
int PlanCommand(const SimCommandOptions& options);

// Checks a job's options and command; "" if fine, else a one-line error.
std::string ValidateJob(const JobOptions& options);

}  // namespace trainguard
