// The commands that run a job: `run` (every node on this host, as steps of
// a Slurm allocation, or one host of several) and `controller`. What they
// share — a controller and its agents until the job ends — is Supervise
// (supervise.cc); `agent` is agent_command.cc.
#include <signal.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/agent.h"
#include "api/http_api.h"
#include "cli/cli_support.h"
#include "cli/commands.h"
#include "cli/host_address.h"
#include "alerts/alert_publisher.h"
#include "alerts/webhook_sender.h"
#include "cli/local_launcher.h"
#include "cli/slurm.h"
#include "cli/slurm_nodes.h"
#include "cli/netns_fabric.h"
#include "cli/root_cause.h"
#include "common/job_secret.h"
#include "common/json_text.h"
#include "controller/job_controller.h"
#include "store/event_store.h"
#include "transport/grpc_transport.h"

#include "cli/supervise.h"

namespace trainguard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int RunOnSlurm(JobOptions o) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "trainguard: error: %s\n", why.c_str());
    return 2;
  };
  if (o.netns) return fail("--netns is for `run` on one machine; with --scheduler slurm the nodes are Slurm's");
  auto allocation = SlurmAllocationFromEnv([](const char* name) { return std::getenv(name); });
  if (!allocation.ok()) return fail(allocation.status().message());
  auto names = Slurm::Hostnames(allocation->nodelist);
  if (!names.ok()) return fail(names.status().message());
  // Nodes cordoned in the store (by an operator, or evicted by any job on a
  // shared store) get no agent.
  auto store = OpenEventStore(o.store);
  if (!store.ok()) return fail(store.status().message());
  SlurmSetup setup;
  std::vector<LocalNode> nodes;
  std::vector<std::string> cordoned;
  for (const std::string& name : *names) {
    auto info = Slurm::Node(name);
    if (!info.ok()) return fail(info.status().message());
    setup.nodes[name] = *info;
    if (name == allocation->this_node) setup.controller_host = info->address.empty() ? name : info->address;
    if (SkipIfCordoned(store->get(), name)) {
      cordoned.push_back(name);
      continue;
    }
    const int position = static_cast<int>(nodes.size());
    nodes.push_back({name, position < o.nnodes ? position : -1, info->address});
  }
  store->reset();
  if (setup.controller_host.empty()) {
    return fail("this node (" + allocation->this_node + ") is not in the allocation's node list " +
                allocation->nodelist);
  }
  if (static_cast<int>(nodes.size()) < o.nnodes) {
    return fail("the Slurm allocation of job " + allocation->job_id + " has " + std::to_string(names->size()) +
                " node(s) (" + allocation->nodelist + ")" +
                (cordoned.empty() ? "" : ", " + std::to_string(cordoned.size()) + " of them cordoned") +
                ": the job needs " + std::to_string(o.nnodes) +
                " (--nnodes); allocate more (sbatch --nodes) or give a smaller --nnodes");
  }
  if (auto port = Slurm::SlurmdPort(); port.ok()) {
    setup.slurmd_port = *port;
  } else {
    std::fprintf(stderr, "trainguard: note: %s; lost nodes are explained by slurmctld alone\n",
                 port.status().message().c_str());
  }
  // Every node of the allocation beyond --nnodes is a spare.
  o.knobs.spares = static_cast<int>(nodes.size()) - o.nnodes;
  std::fprintf(stderr, "trainguard: Slurm job %s: %d node(s) for the job, %d spare(s); the controller runs on %s\n",
               allocation->job_id.c_str(), o.nnodes, o.knobs.spares, allocation->this_node.c_str());
  return Supervise(o, "0.0.0.0:0", nodes, false, false, &setup);
}

}  // namespace

std::string ValidateJob(const JobOptions& o) {
  if (o.command.empty()) return "no command given: trainguard run [options] -- COMMAND [ARGS...]";
  if (o.nnodes < 1) return "--nnodes must be at least 1";
  if (o.min_nnodes < 0 || o.min_nnodes > o.nnodes) return "--nnodes MIN:MAX needs 1 <= MIN <= MAX";
  if (o.nproc_per_node < 1) return "--nproc-per-node must be at least 1";
  if (o.nodes_per_rack < 0) return "--nodes-per-rack must not be negative";
  for (const auto& p : o.diag_paths) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == p.size()) {
      return "--diag-path '" + p + "' is not ROLE=DIR (e.g. checkpoint=/ckpt)";
    }
  }
  auto exe = FindExecutable(o.command[0]);
  if (!exe.ok()) return exe.status().message();
  // `python SCRIPT ...`: a missing script fails every rank the same way; say so now.
  std::string base = fs::path(o.command[0]).filename().string();
  if (base.rfind("python", 0) == 0 && o.command.size() > 1 && o.command[1][0] != '-' &&
      !fs::exists(o.command[1])) {
    return "script not found: " + o.command[1];
  }
  return "";
}

namespace {

// One host of a job that spans hosts: the same command on every host, as with
// torchrun. The host that owns the rendezvous endpoint and binds it first
// runs the controller and its own agent; every other host runs an agent.
int RunOneHostOfSeveral(const JobOptions& o) {
  std::string host;
  int port = -1;
  SplitHostPort(o.rendezvous, &host, &port);
  if (host.empty() || port <= 0) {
    std::fprintf(stderr, "trainguard: error: rendezvous endpoint '%s': expected HOST:PORT\n",
                 o.rendezvous.c_str());
    return 2;
  }
  std::string address = LocalAddressToward(host);
  if (address.empty()) {
    std::fprintf(stderr, "trainguard: error: rendezvous host '%s' does not resolve or has no route\n",
                 host.c_str());
    return 2;
  }
  // Hosts are named by their hostname. Behind a loopback endpoint every
  // "host" is this machine, and they are told apart by their node rank.
  bool loopback = address.rfind("127.", 0) == 0 || address == "::1";
  std::string node_id = !o.node_id.empty() ? o.node_id
                        : !loopback        ? Hostname()
                        : o.node_rank >= 0 ? "node" + std::to_string(o.node_rank)
                                           : "node-pid" + std::to_string(getpid());
  bool v6 = host.find(':') != std::string::npos;
  // The endpoint's host serves it, unless another process of the job got
  // there first (several "hosts" on one machine); a race between two is
  // settled by the listen itself (kEndpointTaken).
  if (IsLocalAddress(host) && CanListenOnPort(port, v6)) {
    std::string listen = std::string(v6 ? "[::]" : "0.0.0.0") + ":" + std::to_string(port);
    int rc = Supervise(o, listen, {{node_id, o.node_rank, address}}, true);
    if (rc != kEndpointTaken) return rc;
    std::fprintf(stderr, "trainguard: %s is served already: joining that controller\n",
                 o.rendezvous.c_str());
  }
  AgentOptions a;
  a.controller = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  a.node_id = node_id;
  a.address = address;
  a.group_rank = o.node_rank;
  a.run_dir_base = !o.run_dir.empty() ? o.run_dir
                   : DefaultRunDirBase() + "/" + (o.job_id.empty() ? "rdzv-" + std::to_string(port) : o.job_id);
  a.connect_timeout_s = static_cast<double>(o.knobs.rendezvous_timeout) / kSecond;
  a.native_stacks = o.native_stacks;
  a.exit_with_job = true;
  a.secret_file = o.secret_file;
  a.reconnect_window_s = (o.knobs.reconnect_window / static_cast<double>(kSecond));
  a.tls_ca = !o.tls_ca.empty() ? o.tls_ca : o.tls_cert;
  return RunAgent(a);
}

}  // namespace

int RunJob(const JobOptions& options) {
  if (options.dry_run) {
    std::string error = ValidateJob(options);
    if (!error.empty()) {
      std::fprintf(stderr, "trainguard: error: %s\n", error.c_str());
      return 2;
    }
    json env = options.env;
    std::cout << json{{"nnodes", options.nnodes},
                      {"min_nnodes", options.min_nnodes > 0 ? options.min_nnodes : options.nnodes},
                      {"nproc_per_node", options.nproc_per_node},
                      {"world_size", options.nnodes * options.nproc_per_node},
                      {"max_restarts", options.knobs.max_restarts},
                      {"job_id", options.job_id},
                      {"run_dir", options.run_dir},
                      {"store", options.store},
                      {"master_addr", options.rendezvous.empty() ? json("127.0.0.1") : json(nullptr)},
                      {"rendezvous", options.rendezvous},
                      {"node_rank", options.node_rank},
                      {"env", env},
                      {"command", options.command}}
                     .dump(-1, ' ', false, kReplaceBadUtf8)
              << "\n";
    return 0;
  }
  if (!options.rendezvous.empty()) return RunOneHostOfSeveral(options);
  if (options.scheduler == "slurm") return RunOnSlurm(options);
  return Supervise(options, "127.0.0.1:0", {}, false, /*pick_local_nodes=*/true);
}

int RunController(const ControllerOptions& options) {
  return Supervise(options.job, options.listen, {}, false);
}

}  // namespace trainguard
