// trainguard: parses the command line and calls one subcommand (commands.h).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"

namespace {

void AddJobOptions(CLI::App* cmd, trainguard::JobOptions* o) {
  cmd->add_option("--nnodes", o->nnodes, "number of nodes (agents)")->capture_default_str();
  cmd->add_option("--nproc-per-node", o->nproc_per_node, "ranks per node")->capture_default_str();
  cmd->add_option("--max-restarts", o->max_restarts, "restarts before the job fails")
      ->capture_default_str();
  cmd->add_option("--hang-timeout", o->hang_timeout_s,
                  "seconds without a step before a rank counts as hung")->capture_default_str();
  cmd->add_option("--startup-timeout", o->startup_timeout_s,
                  "seconds allowed before a rank's first step")->capture_default_str();
  cmd->add_option("--heartbeat-interval", o->heartbeat_interval_s, "agent heartbeat, seconds")
      ->capture_default_str();
  cmd->add_option("--missed-heartbeats", o->missed_heartbeats,
                  "heartbeats missed before a node counts as lost")->capture_default_str();
  cmd->add_option("--stop-grace", o->stop_grace_s, "seconds between SIGTERM and SIGKILL")
      ->capture_default_str();
  cmd->add_option("--stop-timeout", o->stop_timeout_s,
                  "seconds an agent gets to stop its ranks before its node counts as lost")
      ->capture_default_str();
  cmd->add_option("--rendezvous-timeout", o->rendezvous_timeout_s,
                  "seconds to wait for all nodes to join")->capture_default_str();
  cmd->add_option("--store", o->store, "SQLite event store")->capture_default_str();
  cmd->add_option("--job-id", o->job_id, "job id (default: generated)");
  cmd->add_option("--run-dir", o->run_dir, "logs and stacks (default /tmp/trainguard/JOB)");
  cmd->add_flag("--native-stacks", o->native_stacks, "also capture gdb backtraces of hung ranks");
  cmd->add_option("--no-progress-restarts", o->no_progress_restarts,
                  "stop after this many failures in a row without progress")->capture_default_str();
  cmd->add_option("--rules", o->extra_rules, "extra attribution rule file(s)");
  cmd->add_option("command", o->command, "the training command, after --")->required();
}

// Options of the commands that read one job from the store.
void AddStoredJobOptions(CLI::App* cmd, trainguard::EventsOptions* o) {
  cmd->add_option("--store", o->store, "SQLite event store")->capture_default_str();
  cmd->add_option("job", o->job_id, "job id (default: the newest)");
  cmd->add_flag("--json", o->json, "JSON output");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainguard: supervise distributed PyTorch training jobs"};
  app.require_subcommand(1);

  trainguard::JobOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "run a job on this machine: a controller and N agents");
  AddJobOptions(run_cmd, &run);

  trainguard::ControllerOptions ctl;
  CLI::App* ctl_cmd = app.add_subcommand("controller", "run a job's controller; agents join it");
  AddJobOptions(ctl_cmd, &ctl.job);
  ctl_cmd->add_option("--listen", ctl.listen, "HOST:PORT to serve agents on")->capture_default_str();

  trainguard::AgentOptions agent;
  CLI::App* agent_cmd = app.add_subcommand("agent", "run a node agent that joins a controller");
  agent_cmd->add_option("--controller", agent.controller, "controller HOST:PORT")->required();
  agent_cmd->add_option("--node-id", agent.node_id, "node id (default: hostname)");
  agent_cmd->add_option("--address", agent.address, "address peers use to reach this node");
  agent_cmd->add_option("--group-rank", agent.group_rank, "preferred group rank (node rank)");
  agent_cmd->add_option("--run-dir", agent.run_dir, "logs and stacks of this node");
  agent_cmd->add_option("--run-dir-base", agent.run_dir_base, "parent of the default run dir");
  agent_cmd->add_option("--connect-timeout", agent.connect_timeout_s, "seconds")
      ->capture_default_str();
  agent_cmd->add_flag("--native-stacks", agent.native_stacks, "capture gdb backtraces");
  agent_cmd->add_flag("--quiet", agent.quiet, "do not copy rank output to stdout");
  agent_cmd->add_option("--protocol-version", agent.protocol_version)->group("");

  trainguard::EventsOptions events;
  CLI::App* events_cmd = app.add_subcommand("events", "show a job's event log");
  AddStoredJobOptions(events_cmd, &events);

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
  CLI::App* report_cmd = app.add_subcommand("report", "a job's incidents and where its time went");
  AddStoredJobOptions(report_cmd, &report);

  trainguard::AttributeOptions attr;
  CLI::App* attr_cmd = app.add_subcommand("attribute", "say why a failure happened, from its logs");
  attr_cmd->add_option("files", attr.files, "log files, one per rank (rankN in the name), - for stdin")
      ->required();
  attr_cmd->add_option("--rules", attr.extra_rules, "extra rule file(s), merged over the shipped rules");
  attr_cmd->add_flag("--json", attr.json, "JSON output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "trainguard: error: %s (see trainguard --help)\n", e.what());
    return 2;
  }
  if (run_cmd->parsed()) return trainguard::RunJob(run);
  if (ctl_cmd->parsed()) return trainguard::RunController(ctl);
  if (agent_cmd->parsed()) return trainguard::RunAgent(agent);
  if (events_cmd->parsed()) return trainguard::ShowEvents(events);
  if (report_cmd->parsed()) return trainguard::ShowReport(report);
  if (attr_cmd->parsed()) return trainguard::AttributeCommand(attr);
  if (ckpt_ls->parsed()) return trainguard::ListCheckpointsCommand(ckpt);
  if (ckpt_verify->parsed()) return trainguard::VerifyCheckpointsCommand(ckpt);
  return 2;
}
