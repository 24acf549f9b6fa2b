// trainguard: parses the command line and calls one subcommand (commands.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/torchrun_options.h"
#include "controller/event_kind.h"
#include "controller/job_knobs.h"

namespace {

constexpr const char* kStoreHelp =
    "event store: a SQLite file, or a postgresql:// URL that many jobs share (docs/store.md)";


// The job's knobs, from their one table (controller/job_knobs.h).
void AddKnobOptions(CLI::App* cmd, trainguard::JobConfig* knobs) {
  const trainguard::JobConfig defaults;
  for (const trainguard::Knob& k : trainguard::JobKnobs()) {
    if (k.flags.empty()) continue;
    const trainguard::Knob* knob = &k;  // the table lives as long as the program
    if (k.kind == trainguard::KnobKind::kFlag) {
      cmd->add_flag_callback(k.flags, [knob, knobs] { (void)trainguard::SetKnob(*knob, "true", knobs); }, k.help);
      continue;
    }
    cmd->add_option_function<std::string>(
        k.flags,
        [knob, knobs](const std::string& v) {
          trainguard::Status s = trainguard::SetKnob(*knob, v, knobs);
          if (!s.ok()) throw CLI::ValidationError(s.message());
        },
        k.help + " (default " + k.get(defaults) + (k.kind == trainguard::KnobKind::kSeconds ? " s" : "") + ")");
  }
}

void AddJobOptions(CLI::App* cmd, trainguard::JobOptions* o, bool torchrun) {
  AddKnobOptions(cmd, &o->knobs);
  if (!torchrun) {
    cmd->add_option_function<std::string>(
           "--nnodes",
           [o](const std::string& v) {
             auto number = [&](const std::string& part) {
               std::size_t used = 0;
               int n = 0;
               try {
                 n = std::stoi(part, &used);
               } catch (const std::exception&) {
                 used = 0;
               }
               if (used != part.size() || used == 0 || n < 1) {
                 throw CLI::ValidationError("--nnodes", "'" + v + "' is not N or MIN:MAX with 1 <= MIN <= MAX");
               }
               return n;
             };
             const std::size_t colon = v.find(':');
             o->nnodes = number(v.substr(0, colon));
             o->min_nnodes = 0;
             if (colon != std::string::npos) {
               o->min_nnodes = o->nnodes;
               o->nnodes = number(v.substr(colon + 1));
               if (o->min_nnodes > o->nnodes) {
                 throw CLI::ValidationError("--nnodes", "'" + v + "': MIN is larger than MAX");
               }
             }
           },
           "number of nodes (agents), N or MIN:MAX: an elastic job goes on with fewer nodes, down to MIN, "
           "when a failed node has no spare or replacement (default 1)");
    cmd->add_option("--nproc-per-node,--nproc_per_node", o->nproc_per_node, "ranks per node")
        ->capture_default_str();
  }
  cmd->add_option("--diag-path", o->diag_paths, "ROLE=DIR each node's disk probes write (default: its run dir)");
  cmd->add_option("--diag-parallel", o->diag_parallel,
                  "nodes diagnosed at once (default: 1 when `run` has every node on this host, else all)");
  cmd->add_option("--alert-webhook", o->alert_webhooks,
                  "URL that gets a JSON POST for each incident, attribution, decision, eviction, straggler and the "
                  "job's end (retried with backoff, never holding up the job; repeat for several; docs/alerts.md)");
  cmd->add_option("--http", o->http,
                  "HOST:PORT where the controller serves its HTTP API and /metrics "
                  "(port 0: any free one; `off`: none). Reading needs nothing; actions need the job's secret "
                  "(docs/api.md)")
      ->capture_default_str();
  cmd->add_option("--secret-file", o->secret_file,
                  "file holding the job's secret: agents must show it to register, API actions (cancel, cordon) "
                  "take it as their token. Default: a new random one in RUN_DIR/job-secret, readable by you only "
                  "(agents on other hosts are then not checked)");
  cmd->add_option("--store-drain-timeout", o->store_drain_timeout_s,
                  "seconds the controller waits at the job's end for writes still queued for a store that is away "
                  "(while the job runs they wait and are retried as long as it takes)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--tls-cert", o->tls_cert,
                  "PEM certificate (chain) the controller serves the agents' stream with; with --tls-key")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tls-key", o->tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  cmd->add_option("--tls-ca", o->tls_ca,
                  "PEM certificates this host's agents trust (default: --tls-cert itself, if self-signed)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--store", o->store, kStoreHelp)->capture_default_str();
  cmd->add_option("--job-id", o->job_id, "job id (default: generated)");
  cmd->add_option("--run-dir", o->run_dir, "logs and stacks (default $TMPDIR/trainguard/JOB, else /tmp/trainguard/JOB)");
  cmd->add_flag("--native-stacks", o->native_stacks, "also capture gdb backtraces of hung ranks");
  cmd->add_option("--rules", o->extra_rules, "extra attribution rule file(s)");
  // The command (SCRIPT|PROGRAM [ARGS...]) is what follows the options, or `--`.
  cmd->prefix_command();
}

// torchrun's options, in both spellings, with torchrun's meanings
// (cli/torchrun_options.h resolves them).
void AddTorchrunOptions(CLI::App* cmd, trainguard::TorchrunOptions* t, trainguard::JobOptions* o) {
  cmd->add_option("--nnodes", t->nnodes, "number of nodes, N or MIN:MAX (torchrun)")
      ->capture_default_str();
  cmd->add_option("--nproc-per-node,--nproc_per_node", t->nproc_per_node,
                  "ranks per node: N, auto, cpu or gpu")->capture_default_str();
  cmd->add_option("--node-rank,--node_rank", t->node_rank, "this host's node rank when the job spans hosts (torchrun)");
  cmd->add_flag("--standalone", t->standalone, "single host (what `run` does anyway)");
  cmd->add_option("--rdzv-backend,--rdzv_backend", t->rdzv_backend, "torchrun; the controller is the rendezvous");
  cmd->add_option("--rdzv-endpoint,--rdzv_endpoint", t->rdzv_endpoint, "torchrun's rendezvous HOST:PORT");
  cmd->add_option("--rdzv-id,--rdzv_id", t->rdzv_id, "the run id (TORCHELASTIC_RUN_ID); the job id unless --job-id");
  cmd->add_option("--rdzv-conf,--rdzv_conf", t->rdzv_conf, "torchrun; not used");
  cmd->add_option("--monitor-interval,--monitor_interval", t->monitor_interval, "torchrun; not used");
  cmd->add_option("--master-addr,--master_addr", t->master_addr, "torchrun; trainguard sets MASTER_ADDR");
  cmd->add_option("--master-port,--master_port", t->master_port, "torchrun; trainguard picks a free port per restart");
  cmd->add_option("--role", t->role, "ROLE_NAME of every rank");
  cmd->add_option("--log-dir,--log_dir", t->log_dir, "logs go to LOG_DIR/JOB (unless --run-dir)");
  cmd->add_option("-r,--redirects", t->redirects, "torchrun; output always goes to the logs and the console");
  cmd->add_option("-t,--tee", t->tee, "torchrun; output always goes to the logs and the console");
  cmd->add_option("--local-ranks-filter,--local_ranks_filter", t->local_ranks_filter, "torchrun; all ranks are shown");
  cmd->add_flag("--no-python,--no_python", t->no_python, "run the command as a program, not under Python");
  cmd->add_flag("-m,--module", t->module, "run the command as a Python module (python -m)");
  cmd->add_flag("--run-path,--run_path", t->run_path, "run the command as a Python script");
  cmd->add_option("--python", t->python,
                  "interpreter for scripts (default: $TRAINGUARD_PYTHON, else the one torchrun on "
                  "PATH uses, else python3)");
  cmd->add_option("--node-id", o->node_id,
                  "this host's node id when the job spans hosts (default: the hostname)");
  cmd->add_flag("--dry-run", o->dry_run, "print the job this command line means, as JSON, and exit");
}

// Options of the commands that read one job from the store.
void AddStoredJobOptions(CLI::App* cmd, trainguard::EventsOptions* o) {
  cmd->add_option("--store", o->store, kStoreHelp)->capture_default_str();
  cmd->add_option("job", o->job_id, "job id (default: the newest)");
  cmd->add_flag("--json", o->json, "JSON output");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainguard: supervise distributed PyTorch training jobs"};
  app.set_version_flag("--version", std::string("trainguard ") + TG_VERSION + " (commit " + TG_GIT_COMMIT + ")",
                       "print the version and the commit it was built from, and exit");
  app.require_subcommand(1);

  trainguard::JobOptions run;
  run.store = trainguard::DefaultStorePath();
  CLI::App* run_cmd = app.add_subcommand("run", "run a job on this machine: a controller and N agents");
  run_cmd->alias("torchrun");
  trainguard::TorchrunOptions torchrun;
  AddJobOptions(run_cmd, &run, true);
  AddTorchrunOptions(run_cmd, &torchrun, &run);
  run_cmd->add_option("--scheduler", run.scheduler,
                      "local: every node an agent on this machine; slurm: inside an sbatch/salloc allocation, "
                      "an agent on every allocated node (a job step), the nodes beyond --nnodes as spares, "
                      "evicted nodes drained in Slurm (docs/slurm.md)")
      ->check(CLI::IsMember({"local", "slurm"}))
      ->capture_default_str();
  run_cmd->add_flag("--netns", run.netns,
                    "every node in a network namespace of its own, with its own address, behind one bridge "
                    "(needs root; docs/nodes.md)");
  run_cmd->add_option("--nodes-per-rack", run.nodes_per_rack,
                      "node<N> is in rack<N / K>: diagnosis rounds all-reduce among a rack's nodes; with "
                      "--netns every rack has a bridge of its own linked to a spine bridge");
  run_cmd->add_flag("--netns-fallback", run.netns_fallback,
                    "with --netns: without root or namespace support, run in this host's network (with a note)");

  trainguard::ControllerOptions ctl;
  ctl.job.store = trainguard::DefaultStorePath();
  CLI::App* ctl_cmd = app.add_subcommand("controller", "run a job's controller; agents join it");
  AddJobOptions(ctl_cmd, &ctl.job, false);
  ctl_cmd->add_option("--listen", ctl.listen, "HOST:PORT to serve agents on")->capture_default_str();

  trainguard::AgentOptions agent;
  CLI::App* agent_cmd = app.add_subcommand("agent", "run a node agent that joins a controller");
  agent_cmd->add_option("--controller", agent.controller, "controller HOST:PORT; several (HOST:PORT,HOST:PORT): a leader and its standbys, the agent follows whichever leads (docs/standby.md)")->required();
  agent_cmd->add_option("--node-id", agent.node_id, "node id (default: hostname)");
  agent_cmd->add_option("--address", agent.address, "address peers use to reach this node");
  agent_cmd->add_option("--group-rank", agent.group_rank, "preferred group rank (node rank)");
  agent_cmd->add_option("--rack", agent.rack,
                        "the node's rack (top-of-rack switch): diagnosis rounds all-reduce among a rack's "
                        "nodes (default: $TRAINGUARD_RACK)");
  agent_cmd->add_option("--run-dir", agent.run_dir, "logs and stacks of this node");
  agent_cmd->add_option("--run-dir-base", agent.run_dir_base, "parent of the default run dir (default $TMPDIR/trainguard, else /tmp/trainguard)");
  agent_cmd->add_option("--connect-timeout", agent.connect_timeout_s, "seconds")
      ->capture_default_str();
  agent_cmd->add_flag("--native-stacks", agent.native_stacks, "capture gdb backtraces");
  agent_cmd->add_flag("--quiet", agent.quiet, "do not copy rank output to stdout");
  agent_cmd->add_option("--reconnect-window", agent.reconnect_window_s,
                        "seconds the ranks keep running while the agent tries to reconnect to a controller that "
                        "went away (0: stop them and exit at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  agent_cmd->add_option("--tls-ca", agent.tls_ca,
                        "connect over TLS, trusting these PEM certificates (the controller's --tls-cert or its CA)")
      ->check(CLI::ExistingFile);
  agent_cmd->add_option("--secret-file", agent.secret_file,
                        "file holding the job's secret, shown when registering (default: $TRAINGUARD_SECRET_FILE)");
  agent_cmd->add_option("--protocol-version", agent.protocol_version)->group("");

  trainguard::EventsOptions events;
  events.store = trainguard::DefaultStorePath();
  CLI::App* knobs_cmd = app.add_subcommand(
      "knobs", "print every knob of a job (flag, default, accepted values) as docs/reference.md has them");
  CLI::App* events_cmd = app.add_subcommand("events", "show a job's event log");
  AddStoredJobOptions(events_cmd, &events);
  bool event_kinds = false;
  events_cmd->add_flag("--kinds", event_kinds,
                       "print every kind of event (when it is recorded, what its detail holds) as docs/events.md "
                       "has them, and no job's log");

  trainguard::CkptOptions ckpt;
  CLI::App* ckpt_cmd = app.add_subcommand("ckpt", "inspect checkpoints");
  ckpt_cmd->require_subcommand(1);
  CLI::App* ckpt_ls = ckpt_cmd->add_subcommand("ls", "list the checkpoints in DIR");
  ckpt_ls->add_option("dir", ckpt.dir, "checkpoint directory")->required();
  ckpt_ls->add_flag("--json", ckpt.json, "JSON output");
  CLI::App* ckpt_verify = ckpt_cmd->add_subcommand("verify", "verify checkpoints (all or STEP)");
  ckpt_verify->add_option("dir", ckpt.dir, "checkpoint directory")->required();
  ckpt_verify->add_option("step", ckpt.step, "step to verify (default: every one)");

  trainguard::EventsOptions report;
  report.store = trainguard::DefaultStorePath();
  CLI::App* report_cmd = app.add_subcommand("report", "a job's incidents and where its time went");
  AddStoredJobOptions(report_cmd, &report);
  report_cmd->add_flag("--fleet", report.fleet,
                       "every job in the store: incidents per category, node and job, and the failures that recur "
                       "across jobs (the same error on one node; the same program failing at the same step)");

  trainguard::SimCommandOptions sim;
  CLI::App* sim_cmd = app.add_subcommand(
      "sim", "simulate a job of up to 100,000s of GPUs, run by the real controller: ETTR and where the time went");
  sim_cmd->add_option("--failure-model", sim.model, "llama3, meta_rsc, mtbf, or a model file (JSON)")->capture_default_str();
  sim_cmd->add_option("--params", sim.params_file, "parameters as a JSON object (flags override it)");
  struct SimFlag {
    const char* flag;
    const char* name;
    const char* help;
  };
  static const SimFlag sim_flags[] = {
      {"--gpus", "gpus", "GPUs in the job (default 16384)"},
      {"--gpus-per-node", "gpus_per_node", "default: the failure model's (8)"},
      {"--days", "days", "simulated days (default 30)"},
      {"--seed", "seed", "random seed (default 1)"},
      {"--step-s", "step_s", "seconds per training step (default 5)"},
      {"--checkpoint-interval", "checkpoint_interval_s", "seconds between checkpoints (default 1800)"},
      {"--checkpoint-blocked", "checkpoint_blocked_s", "seconds a save blocks training (default 0.159, measured)"},
      {"--restart-s", "restart_s", "launch -> first step, seconds (default 3.52, measured on a 4-rank job)"},
      {"--shutdown-s", "shutdown_s", "Stop -> ranks stopped on a node, seconds (default 0.128, measured)"},
      {"--diagnose-s", "diagnose_s", "one node's diagnostics, seconds (default 2.12, measured)"},
      {"--spares", "spares", "hot spare nodes (default 0)"},
      {"--replacement-s", "replacement_s", "the scheduler brings a node in this long; -1: never (default 300)"},
      {"--pool", "pool", "nodes the scheduler can bring before repairs return some; -1: unlimited"},
      {"--hang-timeout", "hang_timeout_s", "seconds (default 300)"},
      {"--max-restarts", "max_restarts", "-1: unlimited (default)"},
  };
  for (const SimFlag& f : sim_flags) {
    sim_cmd->add_option_function<double>(f.flag, [&sim, name = std::string(f.name)](double v) { sim.set[name] = v; },
                                         f.help);
  }
  sim_cmd->add_option("--diagnose", sim.diagnose, "off, quick or full (default off)")
      ->check(CLI::IsMember({"off", "quick", "full"}));
  sim_cmd->add_option("--sweep", sim.sweep,
                      "NAME=V1,V2,... a parameter's values (repeatable: every combination runs); writes "
                      "sim-sweep.csv and sim-sweep.svg (ETTR against gpus) to --out");
  sim_cmd->add_option("--out", sim.out, "directory of a sweep's files")->capture_default_str();
  sim_cmd->add_option("--store", sim.store, "keep the simulated job's events in this SQLite file (must not exist)");
  sim_cmd->add_flag("--json", sim.json, "JSON output");

  trainguard::StatusCommandOptions status;
  status.stored.store = trainguard::DefaultStorePath();
  CLI::App* status_cmd = app.add_subcommand(
      "status", "a job in a few lines: state, step rate, ETTR, restarts, nodes, last incident (live from its controller)");
  AddStoredJobOptions(status_cmd, &status.stored);
  status_cmd->add_option("--url", status.url, "the controller's API (default: where the job's record says)");
  status_cmd->add_flag("-w,--watch", status.watch, "refresh until the job ends");
  status_cmd->add_option("--interval", status.interval_s, "seconds between refreshes with --watch")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();

  trainguard::HangOptions hang;
  hang.stored.store = trainguard::DefaultStorePath();
  CLI::App* hang_cmd = app.add_subcommand("hang", "where a job's hang sat in its parallel layout");
  AddStoredJobOptions(hang_cmd, &hang.stored);
  hang_cmd->add_option("incident", hang.incident, "incident number (default: the newest hang)");

  trainguard::TraceOptions trace;
  trace.stored.store = trainguard::DefaultStorePath();
  CLI::App* trace_cmd = app.add_subcommand(
      "trace", "one merged timeline of every rank (Chrome trace-event JSON: open in Perfetto or chrome://tracing)");
  trace_cmd->add_option("--store", trace.stored.store, kStoreHelp)->capture_default_str();
  trace_cmd->add_option("job", trace.stored.job_id, "job id (default: the newest)");
  trace_cmd->add_option("--steps", trace.steps, "A:B, A: or :B (default: every step the store kept in detail)");
  trace_cmd->add_option("-o,--output", trace.out, "FILE.json")->required();

  trainguard::HeatmapCommandOptions heatmap;
  heatmap.stored.store = trainguard::DefaultStorePath();
  CLI::App* heatmap_cmd = app.add_subcommand(
      "heatmap", "nodes (or ranks) x phases, or x windows of steps of one phase, coloured against the median");
  heatmap_cmd->add_option("--store", heatmap.stored.store, kStoreHelp)->capture_default_str();
  heatmap_cmd->add_option("job", heatmap.stored.job_id, "job id (default: the newest)");
  heatmap_cmd->add_option("--phase", heatmap.phase,
                          "one phase (forward, gc, comm:all_reduce, gpu:forward, step) over windows of steps");
  heatmap_cmd->add_flag("--ranks", heatmap.ranks, "a row per rank instead of per node");
  heatmap_cmd->add_option("--window", heatmap.window, "steps per column with --phase (default: about 20 columns)");
  heatmap_cmd->add_option("--gpu", heatmap.gpu,
                          "GPUs x windows of time of one figure of the GPU series: sm_clock, memory_clock, "
                          "temperature, power, utilization");
  heatmap_cmd->add_option("-o,--output", heatmap.out, "FILE.svg or FILE.html")->required();

  trainguard::EventsOptions nodes;
  nodes.store = trainguard::DefaultStorePath();
  CLI::App* nodes_cmd = app.add_subcommand(
      "nodes", "each node across jobs: cordoned, suspect or ok, incidents, newest diagnostics, history");
  nodes_cmd->add_option("--store", nodes.store, kStoreHelp)->capture_default_str();
  nodes_cmd->add_flag("--json", nodes.json, "JSON output");
  std::string cordon_store = trainguard::DefaultStorePath(), cordon_node, cordon_reason;
  CLI::App* cordon_cmd = app.add_subcommand("cordon", "take a node out of every job until it is uncordoned");
  cordon_cmd->add_option("--store", cordon_store, kStoreHelp)->capture_default_str();
  cordon_cmd->add_option("node", cordon_node, "node id")->required();
  cordon_cmd->add_option("--reason", cordon_reason, "why (kept with the node and shown by `trainguard nodes`)")
      ->required();
  std::string uncordon_store = trainguard::DefaultStorePath(), uncordon_node, uncordon_reason;
  CLI::App* uncordon_cmd = app.add_subcommand("uncordon", "return a cordoned node to jobs and clear its suspicion");
  uncordon_cmd->add_option("--store", uncordon_store, kStoreHelp)->capture_default_str();
  uncordon_cmd->add_option("node", uncordon_node, "node id")->required();
  uncordon_cmd->add_option("--reason", uncordon_reason, "why (kept with the node)");

  trainguard::DiagOptions diag;
  diag.store = trainguard::DefaultStorePath();
  bool diag_no_store = false;
  CLI::App* diag_cmd = app.add_subcommand(
      "diag", "run the node diagnostics suite here (compute, memory, disks), record it, and judge it "
              "against floors and the other nodes' newest figures");
  diag_cmd->add_option("--store", diag.store, "event store the figures go to: a SQLite file or a postgresql:// URL")
      ->capture_default_str();
  diag_cmd->add_flag("--no-store", diag_no_store, "record nothing; judge by floors only");
  diag_cmd->add_option("--node-id", diag.node_id, "this node's id (default: the hostname)");
  diag_cmd->add_option("--path", diag.paths,
                       "ROLE=DIR: a directory jobs write (checkpoint=/ckpt, scratch=/tmp); repeatable "
                       "(default scratch=$TMPDIR or /tmp)");
  diag_cmd->add_flag("--full", diag.full, "the full suite (about 10 s and 256 MiB per path) instead of the quick one");
  diag_cmd->add_flag("--show", diag.show, "judge every node's newest stored diagnostics; measure nothing");
  diag_cmd->add_option("--max-age", diag.max_age_s, "seconds: older diagnostics are not compared")
      ->capture_default_str();
  diag_cmd->add_option("--floor", diag.floors, "KIND=VALUE: a figure's absolute floor (see docs/nodes.md)");
  diag_cmd->add_option("--fraction", diag.fractions,
                       "KIND=F: a node below F x the nodes' median of KIND fails (see docs/nodes.md)");
  diag_cmd->add_option("--python", diag.python,
                       "interpreter that imports torch with CUDA, for the GPUs' GEMM and copy figures (default "
                       "$TRAINGUARD_PYTHON, else python3)");
  bool diag_no_gpu_compute = false;
  diag_cmd->add_flag("--no-gpu-compute", diag_no_gpu_compute,
                     "skip the GPUs' GEMM and copies (driver health checks still run)");
  diag_cmd->add_flag("--json", diag.json, "JSON output");
  diag_cmd->add_flag("--slurm-drain", diag.slurm_drain,
                     "as a Slurm prolog or epilog (docs/slurm.md): a failing node, or one cordoned in the store, is "
                     "drained in Slurm with the reason and cordoned; the node id defaults to $SLURMD_NODENAME");

  trainguard::AttributeOptions attr;
  CLI::App* attr_cmd = app.add_subcommand("attribute", "say why a failure happened, from its logs");
  attr_cmd->add_option("files", attr.files, "log files, one per rank (rankN in the name), - for stdin")
      ->required();
  attr_cmd->add_option("--rules", attr.extra_rules, "extra rule file(s), merged over the shipped rules");
  attr_cmd->add_flag("--json", attr.json, "JSON output");
  attr_cmd->add_flag("--no-model", attr.no_model, "rules alone: no answer from the learned model");
  attr_cmd->add_flag("--features", attr.features,
                     "print the learned model's features of the log (a JSON list) and nothing else");

  // Everything after the first `--` that follows a job subcommand is the
  // training command, untouched (CLI11 would parse it otherwise).
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> command;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "run" && args[i] != "torchrun" && args[i] != "controller") continue;
    auto dashes = std::find(args.begin() + static_cast<long>(i), args.end(), "--");
    if (dashes != args.end()) {
      command.assign(dashes + 1, args.end());
      args.erase(dashes, args.end());
    }
    break;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "trainguard: error: %s (see trainguard --help)\n", e.what());
    return 2;
  }
  auto take_command = [&](CLI::App* cmd, trainguard::JobOptions* o) {
    // `run [opts] -- CMD ...`, or `run [opts] SCRIPT ARGS ...` where a later
    // `--` belongs to the script's arguments (as with torchrun).
    o->command = cmd->remaining();
    if (!command.empty() && !o->command.empty()) o->command.push_back("--");
    o->command.insert(o->command.end(), command.begin(), command.end());
  };
  if (run_cmd->parsed()) {
    take_command(run_cmd, &run);
    auto notes = trainguard::ResolveTorchrunOptions(torchrun, &run);
    if (!notes.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", notes.status().message().c_str());
      return 2;
    }
    for (const auto& note : *notes) std::fprintf(stderr, "trainguard: note: %s\n", note.c_str());
    return trainguard::RunJob(run);
  }
  if (ctl_cmd->parsed()) {
    take_command(ctl_cmd, &ctl.job);
    return trainguard::RunController(ctl);
  }
  if (agent_cmd->parsed()) return trainguard::RunAgent(agent);
  if (knobs_cmd->parsed()) {
    std::fputs(trainguard::KnobsMarkdown().c_str(), stdout);
    return 0;
  }
  if (events_cmd->parsed() && event_kinds) {
    std::fputs(trainguard::EventKindsMarkdown().c_str(), stdout);
    return 0;
  }
  if (events_cmd->parsed()) return trainguard::ShowEvents(events);
  if (trace_cmd->parsed()) return trainguard::WriteTrace(trace);
  if (heatmap_cmd->parsed()) return trainguard::WriteHeatmap(heatmap);
  if (report_cmd->parsed()) return trainguard::ShowReport(report);
  if (status_cmd->parsed()) return trainguard::ShowStatus(status);
  if (sim_cmd->parsed()) return trainguard::SimCommand(sim);
  if (hang_cmd->parsed()) return trainguard::ShowHang(hang);
  if (nodes_cmd->parsed()) return trainguard::ShowNodes(nodes);
  if (cordon_cmd->parsed()) return trainguard::CordonNode(cordon_store, cordon_node, cordon_reason);
  if (uncordon_cmd->parsed()) return trainguard::UncordonNode(uncordon_store, uncordon_node, uncordon_reason);
  if (diag_cmd->parsed()) {
    if (diag_no_store) diag.store.clear();
    diag.gpu_compute = !diag_no_gpu_compute;
    return trainguard::DiagCommand(diag);
  }
  if (attr_cmd->parsed()) return trainguard::AttributeCommand(attr);
  if (ckpt_ls->parsed()) return trainguard::ListCheckpointsCommand(ckpt);
  if (ckpt_verify->parsed()) return trainguard::VerifyCheckpointsCommand(ckpt);
  return 2;
}
