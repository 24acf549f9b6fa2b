// trainguard: parses the command line and calls one subcommand (commands.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/supervise.h"
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


// A subcommand: its options were added to the app; `run` carries it out
// once the command line named it (`cmd` parsed).
struct Command {
  CLI::App* cmd;
  std::function<int()> run;
};

// The training command that follows `--` (or the options) of a job subcommand.
void TakeCommand(CLI::App* cmd, const std::vector<std::string>& after_dashes, trainguard::JobOptions* o) {
  // `run [opts] -- CMD ...`, or `run [opts] SCRIPT ARGS ...` where a later
  // `--` belongs to the script's arguments (as with torchrun).
  o->command = cmd->remaining();
  if (!after_dashes.empty() && !o->command.empty()) o->command.push_back("--");
  o->command.insert(o->command.end(), after_dashes.begin(), after_dashes.end());
}

Command AddRun(CLI::App& app, const std::vector<std::string>* after_dashes) {
  auto run = std::make_shared<trainguard::JobOptions>();
  auto torchrun = std::make_shared<trainguard::TorchrunOptions>();
  run->store = trainguard::DefaultStorePath();
  CLI::App* cmd = app.add_subcommand("run", "run a job on this machine: a controller and N agents");
  cmd->alias("torchrun");
  AddJobOptions(cmd, run.get(), true);
  AddTorchrunOptions(cmd, torchrun.get(), run.get());
  cmd->add_option("--scheduler", run->scheduler,
                  "local: every node an agent on this machine; slurm: inside an sbatch/salloc allocation, "
                  "an agent on every allocated node (a job step), the nodes beyond --nnodes as spares, "
                  "evicted nodes drained in Slurm (docs/slurm.md)")
      ->check(CLI::IsMember({"local", "slurm"}))
      ->capture_default_str();
  cmd->add_flag("--netns", run->netns,
                "every node in a network namespace of its own, with its own address, behind one bridge "
                "(needs root; docs/nodes.md)");
  cmd->add_option("--nodes-per-rack", run->nodes_per_rack,
                  "node<N> is in rack<N / K>: diagnosis rounds all-reduce among a rack's nodes; with "
                  "--netns every rack has a bridge of its own linked to a spine bridge");
  cmd->add_flag("--netns-fallback", run->netns_fallback,
                "with --netns: without root or namespace support, run in this host's network (with a note)");
  return {cmd, [cmd, run, torchrun, after_dashes] {
            TakeCommand(cmd, *after_dashes, run.get());
            auto notes = trainguard::ResolveTorchrunOptions(*torchrun, run.get());
            if (!notes.ok()) {
              std::fprintf(stderr, "trainguard: error: %s\n", notes.status().message().c_str());
              return 2;
            }
            for (const auto& note : *notes) std::fprintf(stderr, "trainguard: note: %s\n", note.c_str());
            return trainguard::RunJob(*run);
          }};
}

Command AddController(CLI::App& app, const std::vector<std::string>* after_dashes) {
  auto ctl = std::make_shared<trainguard::ControllerOptions>();
  ctl->job.store = trainguard::DefaultStorePath();
  CLI::App* cmd = app.add_subcommand("controller", "run a job's controller; agents join it");
  AddJobOptions(cmd, &ctl->job, false);
  cmd->add_option("--listen", ctl->listen, "HOST:PORT to serve agents on")->capture_default_str();
  return {cmd, [cmd, ctl, after_dashes] {
            TakeCommand(cmd, *after_dashes, &ctl->job);
            return trainguard::RunController(*ctl);
          }};
}

Command AddAgent(CLI::App& app) {
  auto agent = std::make_shared<trainguard::AgentOptions>();
  CLI::App* cmd = app.add_subcommand("agent", "run a node agent that joins a controller");
  cmd->add_option("--controller", agent->controller,
                  "controller HOST:PORT; several (HOST:PORT,HOST:PORT): a leader and its standbys, the agent "
                  "follows whichever leads (docs/standby.md)")
      ->required();
  cmd->add_option("--node-id", agent->node_id, "node id (default: hostname)");
  cmd->add_option("--address", agent->address, "address peers use to reach this node");
  cmd->add_option("--group-rank", agent->group_rank, "preferred group rank (node rank)");
  cmd->add_option("--rack", agent->rack,
                  "the node's rack (top-of-rack switch): diagnosis rounds all-reduce among a rack's "
                  "nodes (default: $TRAINGUARD_RACK)");
  cmd->add_option("--run-dir", agent->run_dir, "logs and stacks of this node");
  cmd->add_option("--run-dir-base", agent->run_dir_base,
                  "parent of the default run dir (default $TMPDIR/trainguard, else /tmp/trainguard)");
  cmd->add_option("--connect-timeout", agent->connect_timeout_s, "seconds")->capture_default_str();
  cmd->add_flag("--native-stacks", agent->native_stacks, "capture gdb backtraces");
  cmd->add_flag("--quiet", agent->quiet, "do not copy rank output to stdout");
  cmd->add_option("--reconnect-window", agent->reconnect_window_s,
                  "seconds the ranks keep running while the agent tries to reconnect to a controller that "
                  "went away (0: stop them and exit at once)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--tls-ca", agent->tls_ca,
                  "connect over TLS, trusting these PEM certificates (the controller's --tls-cert or its CA)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--secret-file", agent->secret_file,
                  "file holding the job's secret, shown when registering (default: $TRAINGUARD_SECRET_FILE)");
  cmd->add_option("--protocol-version", agent->protocol_version)->group("");
  return {cmd, [agent] { return trainguard::RunAgent(*agent); }};
}

// What reads the store: events, report, status, hang, trace, heatmap, nodes, cordon, uncordon.
std::vector<Command> AddStoreReaders(CLI::App& app) {
  std::vector<Command> out;
  {
    CLI::App* cmd = app.add_subcommand(
        "knobs", "print every knob of a job (flag, default, accepted values) as docs/reference.md has them");
    out.push_back({cmd, [] {
                     std::fputs(trainguard::KnobsMarkdown().c_str(), stdout);
                     return 0;
                   }});
  }
  {
    auto events = std::make_shared<trainguard::EventsOptions>();
    auto kinds = std::make_shared<bool>(false);
    events->store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand("events", "show a job's event log");
    AddStoredJobOptions(cmd, events.get());
    cmd->add_flag("--kinds", *kinds,
                  "print every kind of event (when it is recorded, what its detail holds) as docs/events.md "
                  "has them, and no job's log");
    out.push_back({cmd, [events, kinds] {
                     if (!*kinds) return trainguard::ShowEvents(*events);
                     std::fputs(trainguard::EventKindsMarkdown().c_str(), stdout);
                     return 0;
                   }});
  }
  {
    auto report = std::make_shared<trainguard::EventsOptions>();
    report->store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand("report", "a job's incidents and where its time went");
    AddStoredJobOptions(cmd, report.get());
    cmd->add_flag("--fleet", report->fleet,
                  "every job in the store: incidents per category, node and job, and the failures that recur "
                  "across jobs (the same error on one node; the same program failing at the same step)");
    out.push_back({cmd, [report] { return trainguard::ShowReport(*report); }});
  }
  {
    auto status = std::make_shared<trainguard::StatusCommandOptions>();
    status->stored.store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand(
        "status",
        "a job in a few lines: state, step rate, ETTR, restarts, nodes, last incident (live from its controller)");
    AddStoredJobOptions(cmd, &status->stored);
    cmd->add_option("--url", status->url, "the controller's API (default: where the job's record says)");
    cmd->add_flag("-w,--watch", status->watch, "refresh until the job ends");
    cmd->add_option("--interval", status->interval_s, "seconds between refreshes with --watch")
        ->check(CLI::Range(0.1, 3600.0))
        ->capture_default_str();
    out.push_back({cmd, [status] { return trainguard::ShowStatus(*status); }});
  }
  {
    auto hang = std::make_shared<trainguard::HangOptions>();
    hang->stored.store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand("hang", "where a job's hang sat in its parallel layout");
    AddStoredJobOptions(cmd, &hang->stored);
    cmd->add_option("incident", hang->incident, "incident number (default: the newest hang)");
    out.push_back({cmd, [hang] { return trainguard::ShowHang(*hang); }});
  }
  {
    auto trace = std::make_shared<trainguard::TraceOptions>();
    trace->stored.store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand(
        "trace", "one merged timeline of every rank (Chrome trace-event JSON: open in Perfetto or chrome://tracing)");
    cmd->add_option("--store", trace->stored.store, kStoreHelp)->capture_default_str();
    cmd->add_option("job", trace->stored.job_id, "job id (default: the newest)");
    cmd->add_option("--steps", trace->steps, "A:B, A: or :B (default: every step the store kept in detail)");
    cmd->add_option("-o,--output", trace->out, "FILE.json")->required();
    out.push_back({cmd, [trace] { return trainguard::WriteTrace(*trace); }});
  }
  {
    auto heatmap = std::make_shared<trainguard::HeatmapCommandOptions>();
    heatmap->stored.store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand(
        "heatmap", "nodes (or ranks) x phases, or x windows of steps of one phase, coloured against the median");
    cmd->add_option("--store", heatmap->stored.store, kStoreHelp)->capture_default_str();
    cmd->add_option("job", heatmap->stored.job_id, "job id (default: the newest)");
    cmd->add_option("--phase", heatmap->phase,
                    "one phase (forward, gc, comm:all_reduce, gpu:forward, step) over windows of steps");
    cmd->add_flag("--ranks", heatmap->ranks, "a row per rank instead of per node");
    cmd->add_option("--window", heatmap->window, "steps per column with --phase (default: about 20 columns)");
    cmd->add_option("--gpu", heatmap->gpu,
                    "GPUs x windows of time of one figure of the GPU series: sm_clock, memory_clock, "
                    "temperature, power, utilization");
    cmd->add_option("-o,--output", heatmap->out, "FILE.svg or FILE.html")->required();
    out.push_back({cmd, [heatmap] { return trainguard::WriteHeatmap(*heatmap); }});
  }
  {
    auto nodes = std::make_shared<trainguard::EventsOptions>();
    nodes->store = trainguard::DefaultStorePath();
    CLI::App* cmd = app.add_subcommand(
        "nodes", "each node across jobs: cordoned, suspect or ok, incidents, newest diagnostics, history");
    cmd->add_option("--store", nodes->store, kStoreHelp)->capture_default_str();
    cmd->add_flag("--json", nodes->json, "JSON output");
    out.push_back({cmd, [nodes] { return trainguard::ShowNodes(*nodes); }});
  }
  for (const bool cordon : {true, false}) {
    struct Args {
      std::string store = trainguard::DefaultStorePath(), node, reason;
    };
    auto a = std::make_shared<Args>();
    CLI::App* cmd = cordon ? app.add_subcommand("cordon", "take a node out of every job until it is uncordoned")
                           : app.add_subcommand("uncordon", "return a cordoned node to jobs and clear its suspicion");
    cmd->add_option("--store", a->store, kStoreHelp)->capture_default_str();
    cmd->add_option("node", a->node, "node id")->required();
    if (cordon) {
      cmd->add_option("--reason", a->reason, "why (kept with the node and shown by `trainguard nodes`)")->required();
    } else {
      cmd->add_option("--reason", a->reason, "why (kept with the node)");
    }
    out.push_back({cmd, [a, cordon] {
                     return cordon ? trainguard::CordonNode(a->store, a->node, a->reason)
                                   : trainguard::UncordonNode(a->store, a->node, a->reason);
                   }});
  }
  return out;
}

// The simulation's parameters as flags (SimParams' names): `sim` takes them
// all, `plan` those with a plan help (what it varies itself, the
// checkpoints, spares and hang timeout, it does not take).
struct SimFlag {
  const char* flag;
  const char* name;
  const char* help;
  const char* plan_help;  // nullptr: not a plan flag
};
constexpr SimFlag kSimFlags[] = {
    {"--gpus", "gpus", "GPUs in the job (default 16384)", "GPUs in the job (default 16384)"},
    {"--gpus-per-node", "gpus_per_node", "default: the failure model's (8)", "default: the failure model's (8)"},
    {"--days", "days", "simulated days (default 30)", "simulated days per candidate (default 7)"},
    {"--seed", "seed", "random seed (default 1)", "random seed, the same for every candidate (default 1)"},
    {"--step-s", "step_s", "seconds per training step (default 5)", "seconds per training step (default 5)"},
    {"--checkpoint-interval", "checkpoint_interval_s", "seconds between checkpoints (default 1800)", nullptr},
    {"--checkpoint-blocked", "checkpoint_blocked_s", "seconds a save blocks training (default 0.159, measured)",
     "seconds a save blocks training (default 0.159)"},
    {"--memory-interval", "memory_interval_s",
     "seconds between saves to node memory (fixed policy; default 0: every save goes to storage)", nullptr},
    {"--persist-s", "persist_s", "a save's write to storage, seconds (default 64)",
     "a save's write to storage, seconds (default 64)"},
    {"--peer-copy-s", "peer_copy_s", "a save's push to the peer node's memory, seconds (default 1.3)", nullptr},
    {"--peer-loss-fraction", "peer_loss_fraction", "share of lost hosts that take their peer along (default 0.02)",
     nullptr},
    {"--restore-memory-s", "restore_memory_s", "reading a checkpoint back from node memory, seconds (default 0.32)",
     nullptr},
    {"--restore-storage-s", "restore_storage_s", "reading a checkpoint back from storage, seconds (default 64)",
     nullptr},
    {"--restart-s", "restart_s", "launch -> first step, seconds (default 3.52, measured on a 4-rank job)",
     "launch -> first step, seconds (default 3.52)"},
    {"--import-s-per-node", "import_s_per_node",
     "added to the restart per node: imports from a shared file system without a cache (default 0)",
     "added to the restart per node: imports from a shared file system without a cache (default 0)"},
    {"--store-s-per-rank", "store_s_per_rank", "added to the restart per rank: the rendezvous store (default 0)",
     "added to the restart per rank: the rendezvous store (default 0)"},
    {"--nccl-init-s-per-rank", "nccl_init_s_per_rank",
     "added to the restart per rank: NCCL's communicator set-up (default 0)",
     "added to the restart per rank: NCCL's communicator set-up (default 0)"},
    {"--fingerprint-every", "fingerprint_every",
     "parameter fingerprints every N steps, compared among data-parallel replicas; 0: off (default 1)", nullptr},
    {"--model-parallel", "model_parallel",
     "ranks holding one copy of the model (TP x PP x CP); default: one node's GPUs", nullptr},
    {"--shutdown-s", "shutdown_s", "Stop -> ranks stopped on a node, seconds (default 0.128, measured)", nullptr},
    {"--diagnose-s", "diagnose_s", "one node's diagnostics, seconds (default 2.12, measured)", nullptr},
    {"--spares", "spares", "hot spare nodes (default 0)", nullptr},
    {"--replacement-s", "replacement_s", "the scheduler brings a node in this long; -1: never (default 300)",
     "the scheduler brings a node in this long; -1: never (default 300)"},
    {"--pool", "pool", "nodes the scheduler can bring before repairs return some; -1: unlimited", nullptr},
    {"--hang-timeout", "hang_timeout_s", "seconds (default 300)", nullptr},
    {"--max-restarts", "max_restarts", "-1: unlimited (default)", nullptr},
};

void AddSimFlags(CLI::App* cmd, const std::shared_ptr<trainguard::SimCommandOptions>& o, bool plan) {
  for (const SimFlag& f : kSimFlags) {
    if (plan && f.plan_help == nullptr) continue;
    cmd->add_option_function<double>(f.flag, [o, name = std::string(f.name)](double v) { o->set[name] = v; },
                                     plan ? f.plan_help : f.help);
  }
}

Command AddPlan(CLI::App& app) {
  auto plan = std::make_shared<trainguard::SimCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "before a launch: simulate how to checkpoint, how many spares and which hang timeout; print the "
              "recommended settings with the ETTR each gives (and plan.svg)");
  cmd->add_option("--failure-model", plan->model, "llama3, meta_rsc, mtbf, or a model file (JSON)")->capture_default_str();
  AddSimFlags(cmd, plan, /*plan=*/true);
  cmd->add_option("--out", plan->out, "directory of plan.svg")->capture_default_str();
  cmd->add_flag("--json", plan->json, "JSON output");
  return {cmd, [plan] { return trainguard::PlanCommand(*plan); }};
}

Command AddSim(CLI::App& app) {
  auto sim = std::make_shared<trainguard::SimCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sim", "simulate a job of up to 100,000s of GPUs, run by the real controller: ETTR and where the time went");
  cmd->add_option("--failure-model", sim->model, "llama3, meta_rsc, mtbf, or a model file (JSON)")->capture_default_str();
  cmd->add_option("--params", sim->params_file, "parameters as a JSON object (flags override it)");
  AddSimFlags(cmd, sim, /*plan=*/false);
  cmd->add_option("--diagnose", sim->diagnose, "off, quick or full (default off)")
      ->check(CLI::IsMember({"off", "quick", "full"}));
  cmd->add_option("--checkpoint-policy", sim->checkpoint_policy,
                  "fixed (the intervals given) or auto (the controller's checkpoint plan); default fixed")
      ->check(CLI::IsMember({"fixed", "auto"}));
  cmd->add_option("--straggler-action", sim->straggler_action,
                  "report (an event; default) or evict (replace the slow node: a restart)")
      ->check(CLI::IsMember({"report", "evict"}));
  cmd->add_option("--sweep", sim->sweep,
                  "NAME=V1,V2,... a parameter's values (repeatable: every combination runs); writes "
                  "sim-sweep.csv and sim-sweep.svg (ETTR against gpus) to --out");
  cmd->add_option("--out", sim->out, "directory of a sweep's files")->capture_default_str();
  cmd->add_option("--store", sim->store, "keep the simulated job's events in this SQLite file (must not exist)");
  cmd->add_flag("--json", sim->json, "JSON output");
  return {cmd, [sim] { return trainguard::SimCommand(*sim); }};
}

Command AddDiag(CLI::App& app) {
  struct Args {
    trainguard::DiagOptions diag;
    bool no_store = false;
    bool no_gpu_compute = false;
  };
  auto a = std::make_shared<Args>();
  a->diag.store = trainguard::DefaultStorePath();
  CLI::App* cmd = app.add_subcommand(
      "diag", "run the node diagnostics suite here (compute, memory, disks), record it, and judge it "
              "against floors and the other nodes' newest figures");
  cmd->add_option("--store", a->diag.store, "event store the figures go to: a SQLite file or a postgresql:// URL")
      ->capture_default_str();
  cmd->add_flag("--no-store", a->no_store, "record nothing; judge by floors only");
  cmd->add_option("--node-id", a->diag.node_id, "this node's id (default: the hostname)");
  cmd->add_option("--path", a->diag.paths,
                  "ROLE=DIR: a directory jobs write (checkpoint=/ckpt, scratch=/tmp); repeatable "
                  "(default scratch=$TMPDIR or /tmp)");
  cmd->add_flag("--full", a->diag.full, "the full suite (about 10 s and 256 MiB per path) instead of the quick one");
  cmd->add_flag("--show", a->diag.show, "judge every node's newest stored diagnostics; measure nothing");
  cmd->add_option("--max-age", a->diag.max_age_s, "seconds: older diagnostics are not compared")
      ->capture_default_str();
  cmd->add_option("--floor", a->diag.floors, "KIND=VALUE: a figure's absolute floor (see docs/nodes.md)");
  cmd->add_option("--fraction", a->diag.fractions,
                  "KIND=F: a node below F x the nodes' median of KIND fails (see docs/nodes.md)");
  cmd->add_option("--python", a->diag.python,
                  "interpreter that imports torch with CUDA, for the GPUs' GEMM and copy figures (default "
                  "$TRAINGUARD_PYTHON, else python3)");
  cmd->add_flag("--no-gpu-compute", a->no_gpu_compute, "skip the GPUs' GEMM and copies (driver health checks still run)");
  cmd->add_flag("--json", a->diag.json, "JSON output");
  cmd->add_flag("--slurm-drain", a->diag.slurm_drain,
                "as a Slurm prolog or epilog (docs/slurm.md): a failing node, or one cordoned in the store, is "
                "drained in Slurm with the reason and cordoned; the node id defaults to $SLURMD_NODENAME");
  return {cmd, [a] {
            if (a->no_store) a->diag.store.clear();
            a->diag.gpu_compute = !a->no_gpu_compute;
            return trainguard::DiagCommand(a->diag);
          }};
}

Command AddAttribute(CLI::App& app) {
  auto attr = std::make_shared<trainguard::AttributeOptions>();
  CLI::App* cmd = app.add_subcommand("attribute", "say why a failure happened, from its logs");
  cmd->add_option("files", attr->files, "log files, one per rank (rankN in the name), - for stdin")->required();
  cmd->add_option("--rules", attr->extra_rules, "extra rule file(s), merged over the shipped rules");
  cmd->add_flag("--json", attr->json, "JSON output");
  cmd->add_flag("--no-model", attr->no_model, "rules alone: no answer from the learned model");
  cmd->add_flag("--features", attr->features,
                "print the learned model's features of the log (a JSON list) and nothing else");
  cmd->add_flag("--each", attr->each,
                "every file is a log of its own: one JSON line each (its answer, or its features), in order");
  return {cmd, [attr] { return trainguard::AttributeCommand(*attr); }};
}

std::vector<Command> AddCkpt(CLI::App& app) {
  auto ckpt = std::make_shared<trainguard::CkptOptions>();
  CLI::App* cmd = app.add_subcommand("ckpt", "inspect checkpoints");
  cmd->require_subcommand(1);
  CLI::App* ls = cmd->add_subcommand("ls", "list the checkpoints in DIR");
  ls->add_option("dir", ckpt->dir, "checkpoint directory")->required();
  ls->add_flag("--json", ckpt->json, "JSON output");
  CLI::App* verify = cmd->add_subcommand("verify", "verify checkpoints (all or STEP)");
  verify->add_option("dir", ckpt->dir, "checkpoint directory")->required();
  verify->add_option("step", ckpt->step, "step to verify (default: every one)");
  return {{ls, [ckpt] { return trainguard::ListCheckpointsCommand(*ckpt); }},
          {verify, [ckpt] { return trainguard::VerifyCheckpointsCommand(*ckpt); }}};
}

// Everything after the first `--` that follows a job subcommand is the
// training command, untouched (CLI11 would parse it otherwise): taken out
// of `args` into the result.
std::vector<std::string> TakeTrainingCommand(std::vector<std::string>* args) {
  std::vector<std::string> command;
  for (std::size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a != "run" && a != "torchrun" && a != "controller") continue;
    auto dashes = std::find(args->begin() + static_cast<long>(i), args->end(), "--");
    if (dashes != args->end()) {
      command.assign(dashes + 1, args->end());
      args->erase(dashes, args->end());
    }
    break;
  }
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  trainguard::RememberCommandLine(argc, argv);  // a controller that steps down stands by again as it
  CLI::App app{"trainguard: supervise distributed PyTorch training jobs"};
  app.set_version_flag("--version", std::string("trainguard ") + TG_VERSION + " (commit " + TG_GIT_COMMIT + ")",
                       "print the version and the commit it was built from, and exit");
  app.require_subcommand(1);
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::vector<std::string> training_command = TakeTrainingCommand(&args);
  std::vector<Command> commands = {AddRun(app, &training_command), AddController(app, &training_command),
                                   AddAgent(app)};
  for (Command& c : AddStoreReaders(app)) commands.push_back(std::move(c));
  for (Command& c : AddCkpt(app)) commands.push_back(std::move(c));
  commands.push_back(AddSim(app));
  commands.push_back(AddPlan(app));
  commands.push_back(AddDiag(app));
  commands.push_back(AddAttribute(app));
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
  for (const Command& c : commands) {
    if (c.cmd->parsed()) return c.run();
  }
  return 2;
}
