// The commands that run a job: `run` (every node on this host, or one host
// of several), `controller` and `agent`.
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

namespace trainguard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Nanos Seconds(double s) { return static_cast<Nanos>(s * kSecond); }

}  // namespace

namespace {

JobConfig MakeConfig(const JobOptions& o, const std::string& job_id) {
  JobConfig c;
  c.job_id = job_id;
  c.nnodes = o.nnodes;
  c.min_nnodes = o.min_nnodes;
  c.elastic_wait = Seconds(o.elastic_wait_s);
  c.nproc_per_node = o.nproc_per_node;
  c.argv = o.command;
  c.env = o.env;
  c.max_restarts = o.max_restarts;
  c.spares = o.spares;
  c.diagnose = o.diagnose;
  c.diag_paths = o.diag_paths;
  c.diag_parallelism = std::max(o.diag_parallel, 0);
  c.diag_timeout = Seconds(o.diag_timeout_s);
  c.link_flaps_to_evict = o.link_flaps_to_evict;
  c.link_flap_window = Seconds(o.link_flap_window_s);
  c.no_instrument = o.no_instrument;
  c.hang_timeout = Seconds(o.hang_timeout_s);
  c.hang_timeout_auto = o.hang_timeout_auto;
  c.hang_timeout_floor = Seconds(o.hang_timeout_floor_s);
  c.startup_timeout = Seconds(o.startup_timeout_s);
  c.heartbeat_interval = Seconds(o.heartbeat_interval_s);
  c.missed_heartbeats = o.missed_heartbeats;
  c.stop_grace = Seconds(o.stop_grace_s);
  c.stop_timeout = Seconds(o.stop_timeout_s);
  c.rendezvous_timeout = Seconds(o.rendezvous_timeout_s);
  c.no_progress_restarts = o.no_progress_restarts;
  c.reconnect_window = Seconds(o.reconnect_window_s);
  c.straggler_action = o.straggler_action;
  c.straggler.min_slowdown = o.straggler_threshold;
  c.straggler.window_steps = o.straggler_window;
  c.straggler.windows_to_evict = o.straggler_evict_windows;
  return c;
}

void PrintDowntime(EventStore* store, const std::string& job_id) {
  auto events = store->Events(job_id);
  if (!events.ok()) return;
  for (const auto& e : *events) {
    if (e.kind == "attribution" || e.kind == "decision" || e.kind == "downtime") {
      std::fprintf(stderr, "trainguard:   %s\n", e.message.c_str());
    }
  }
}

// An agent this process starts next to its controller.
struct LocalNode {
  std::string node_id;
  int group_rank = -1;     // -1: from a "node<N>" id, else any
  std::string address;     // what peers reach it at
};

// Supervise's answer when the endpoint it was to serve is served already
// (another host of the job bound it first): nothing was recorded.
constexpr int kEndpointTaken = -1;

// Runs a controller on `listen` until the job finishes, and `local_nodes`'
// agents next to it. With `endpoint_may_be_taken`, a listen address in use
// returns kEndpointTaken before anything is written to the store.
// The agents `run` starts on this machine: node<i> for the lowest i whose
// node is not cordoned, nnodes of them with group ranks 0.. and then the
// spares; and, without spares, where a new node comes from when one is
// evicted (the next such id).
// Whether `id` is cordoned in the store; if so, says that the job does not
// use it, who cordoned it and how to return it.
bool SkipIfCordoned(EventStore* store, const std::string& id) {
  auto health = store->GetNodeHealth(id);
  if (!health.ok() || health->status != "cordoned") return false;
  std::fprintf(stderr, "trainguard: node %s is cordoned (%s%s): not used; `trainguard uncordon %s` returns it\n",
               id.c_str(), health->reason.c_str(),
               health->job_id.empty() ? "" : (", by job " + health->job_id).c_str(), id.c_str());
  return true;
}

std::vector<LocalNode> PickLocalNodes(EventStore* store, int nnodes, int spares) {
  std::vector<LocalNode> nodes;
  for (int i = 0; static_cast<int>(nodes.size()) < nnodes + spares; ++i) {
    std::string id = "node" + std::to_string(i);
    if (SkipIfCordoned(store, id)) continue;
    int position = static_cast<int>(nodes.size());
    nodes.push_back({id, position < nnodes ? position : -1, "127.0.0.1"});
  }
  return nodes;
}

// The nodes of a Slurm allocation (`run --scheduler slurm`): every one of
// them gets an agent, the first --nnodes hold the job, the rest are spares.
struct SlurmSetup {
  std::map<std::string, SlurmNodeInfo> nodes;  // by name
  std::string controller_host;                 // this node's address
  int slurmd_port = 0;                         // where every slurmd listens (0: unknown)
};

int Supervise(const JobOptions& o, const std::string& listen, std::vector<LocalNode> local_nodes,
              bool endpoint_may_be_taken, bool pick_local_nodes = false, const SlurmSetup* slurm = nullptr) {
  // `run` starts every node itself: on this host, or as steps of a Slurm allocation.
  const bool starts_nodes = pick_local_nodes || slurm != nullptr;
  std::string error = ValidateJob(o);
  if (!error.empty()) {
    std::fprintf(stderr, "trainguard: error: %s\n", error.c_str());
    return 2;
  }
  // --netns without what it needs: said first, in one line.
  const std::string netns_unavailable = pick_local_nodes && o.netns ? NetnsFabric::Unavailable() : "";
  if (!netns_unavailable.empty() && !o.netns_fallback) {
    std::fprintf(stderr, "trainguard: error: %s (--netns-fallback runs the nodes in this host's network instead)\n",
                 netns_unavailable.c_str());
    return 2;
  }
  // The default store's per-user directory is made on first use; a --store
  // in a directory that does not exist is an error, as the user wrote it.
  if (o.store == DefaultStorePath()) {
    std::error_code dir_error;
    fs::create_directories(fs::path(o.store).parent_path(), dir_error);
  }
  auto store = OpenEventStore(o.store);
  if (!store.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", store.status().message().c_str());
    return 2;
  }
  // The controller's writer thread has a connection of its own: a write that
  // waits on the server (a locked file, a restarting PostgreSQL) never holds
  // up the controller's reads (store/store_writer.h).
  auto write_store = OpenEventStore(o.store);
  if (!write_store.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", write_store.status().message().c_str());
    return 2;
  }
  auto rules = LoadRulesFor(o.extra_rules);
  if (!rules.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", rules.status().message().c_str());
    return 2;
  }
  if (pick_local_nodes) local_nodes = PickLocalNodes(store->get(), o.nnodes, o.spares);
  std::string job_id = o.job_id.empty() ? DefaultJobId() : o.job_id;
  JobConfig config = MakeConfig(o, job_id);
  // Nodes that share this host must not measure each other.
  if (o.diag_parallel < 0 && pick_local_nodes) config.diag_parallelism = 1;
  std::string run_dir = o.run_dir.empty() ? "/tmp/trainguard/" + job_id : o.run_dir;
  // The job's secret: agents show it when they register, API actions take
  // it as their token. From --secret-file, or new (written to the run dir
  // once the job is recorded). Agents are checked when the secret came from
  // a file, or when `run` starts every node itself.
  std::string secret, secret_path = o.secret_file;
  if (!o.secret_file.empty()) {
    auto read = ReadJobSecret(o.secret_file);
    if (!read.ok()) {
      std::fprintf(stderr, "trainguard: error: --secret-file: %s\n", read.status().message().c_str());
      return 2;
    }
    secret = *read;
  } else {
    auto made = NewJobSecret();
    if (!made.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", made.status().message().c_str());
      return 2;
    }
    secret = *made;
    secret_path = run_dir + "/job-secret";
  }
  const bool agents_checked = !o.secret_file.empty() || starts_nodes;
  if (agents_checked) config.agent_secret = secret;
  // --http: bound before the controller exists, so that the job's record
  // says where its API is; it serves once the job is recorded.
  std::unique_ptr<HttpApi> api;
  if (o.http != "off") {
    HttpApiOptions api_options;
    api_options.listen = o.http;
    api_options.token = secret;
    api = std::make_unique<HttpApi>(store->get(), api_options);
    if (Status bound = api->Bind(); !bound.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", bound.message().c_str());
      return 2;
    }
    config.api_url = api->url();
  }
  JobController controller(config, RealClock::Get(), store->get(), nullptr, &rules.value(), write_store->get());
  struct ApiGuard {  // the API stops serving before the controller goes
    std::unique_ptr<HttpApi>* api;
    ~ApiGuard() {
      if (*api) (*api)->Stop();
    }
  } api_guard{&api};
  // --alert-webhook: alerts go out from senders' own threads.
  std::vector<std::unique_ptr<WebhookSender>> webhooks;
  std::vector<WebhookSender*> webhook_ptrs;
  for (const std::string& url : o.alert_webhooks) {
    auto sender = WebhookSender::Create(url);
    if (!sender.ok()) {
      std::fprintf(stderr, "trainguard: error: --alert-webhook: %s\n", sender.status().message().c_str());
      return 2;
    }
    webhook_ptrs.push_back(sender->get());
    webhooks.push_back(std::move(sender.value()));
  }
  AlertPublisher alerts(webhook_ptrs);
  struct ListenerGuard {  // the controller stops telling `alerts` before it goes
    JobController* c;
    ~ListenerGuard() { c->SetEventListener(nullptr); }
  } listener_guard{&controller};
  if (!webhooks.empty()) controller.SetEventListener(&alerts);
  // --netns: every local node in a network namespace of its own, behind one
  // bridge; made before the launcher so that it is removed after it.
  std::unique_ptr<NetnsFabric> fabric;
  std::string listen_on = listen, controller_host = slurm != nullptr ? slurm->controller_host : "127.0.0.1";
  if (pick_local_nodes && o.netns) {
    if (!netns_unavailable.empty()) {
      std::fprintf(stderr, "trainguard: note: %s; the nodes share this host's network (--netns-fallback)\n",
                   netns_unavailable.c_str());
    } else {
      fabric = std::make_unique<NetnsFabric>(job_id);
      if (Status made = fabric->Create(); !made.ok()) {
        std::fprintf(stderr, "trainguard: error: --netns: %s\n", made.message().c_str());
        return 2;
      }
      listen_on = fabric->gateway() + ":0";
      controller_host = fabric->gateway();
    }
  }
  std::unique_ptr<LocalLauncher> launcher;
  std::unique_ptr<SlurmNodes> slurm_nodes;  // goes before the launcher it drives

  // Before any thread exists (gRPC's included): the watcher blocks SIGINT and
  // SIGTERM in every thread created after it, so they reach only the watcher.
  std::atomic<int> interrupted_by{0};
  SignalWatcher signals([&](int sig) {
    interrupted_by = sig;
    controller.Cancel(std::string("interrupted by signal ") + strsignal(sig));
  });
  // Listen first: a host that finds the endpoint taken joins as an agent and
  // must leave no job behind. Agents that register before Start() are
  // welcomed by it.
  GrpcControllerServer server(&controller);
  Status listening = server.Start(listen_on, {o.tls_cert, o.tls_key});
  if (!listening.ok()) {
    if (endpoint_may_be_taken && listening.code() == StatusCode::kUnavailable) return kEndpointTaken;
    std::fprintf(stderr, "trainguard: error: %s\n", listening.message().c_str());
    return 2;
  }
  // `controller` on the store of a job that has not ended takes it back
  // (its controller died): agents that kept their ranks reconnect.
  bool resume = false;
  if (!pick_local_nodes && local_nodes.empty() && !o.job_id.empty()) {
    if (auto jobs = store->get()->Jobs(); jobs.ok()) {
      for (const auto& j : *jobs) {
        if (j.job_id == job_id && j.state != "SUCCEEDED" && j.state != "FAILED") resume = true;
      }
    }
  }
  if (resume) {
    std::fprintf(stderr, "trainguard: job %s is in %s and has not ended: taking it back (its agents have %.0f s "
                         "to reconnect)\n",
                 job_id.c_str(), StoreDisplayName(o.store).c_str(), o.reconnect_window_s);
  }
  Status started = resume ? controller.Resume() : controller.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", started.message().c_str());
    return 2;
  }
  if (o.secret_file.empty()) {
    if (Status written = WriteJobSecret(secret_path, secret); !written.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", written.message().c_str());
      controller.Cancel("the job secret could not be written");
      return 2;
    }
  }
  if (!agents_checked) {
    std::fprintf(stderr, "trainguard: note: agents are not authenticated; give the controller and every agent "
                         "--secret-file FILE (the same secret) to refuse strangers\n");
  }
  if (api) {
    api->Serve(&controller);
    std::fprintf(stderr, "trainguard: job %s: API and metrics at %s (actions need the job secret in %s)\n",
                 job_id.c_str(), api->url().c_str(), secret_path.c_str());
  }
  std::atomic<bool> ticking{true};
  std::thread ticker([&] {
    while (ticking.load() && !controller.finished()) {
      controller.Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::fprintf(stderr, "trainguard: job %s: controller on port %d, %d node(s) x %d rank(s), store %s\n",
               job_id.c_str(), server.port(), o.nnodes, o.nproc_per_node, StoreDisplayName(o.store).c_str());
  if (!local_nodes.empty()) {
    std::vector<std::string> args = {"--controller", controller_host + ":" + std::to_string(server.port()),
                                     "--run-dir-base", run_dir, "--connect-timeout", "30",
                                     "--reconnect-window", std::to_string(o.reconnect_window_s)};
    // Agents on this host read the secret's file; steps on other nodes get
    // it in their environment (never on a command line).
    if (slurm == nullptr) args.insert(args.end(), {"--secret-file", secret_path});
    // With TLS, its own agents trust --tls-ca, else the certificate itself (self-signed).
    const std::string trust = !o.tls_ca.empty() ? o.tls_ca : o.tls_cert;
    if (!trust.empty()) args.insert(args.end(), {"--tls-ca", trust});
    if (o.native_stacks) args.push_back("--native-stacks");
    launcher = std::make_unique<LocalLauncher>(SelfExe(), args);
    const int per_rack = o.nodes_per_rack;
    auto rack_of = [per_rack](const std::string& node_id) -> std::string {
      if (per_rack <= 0 || node_id.rfind("node", 0) != 0 || node_id.size() <= 4 ||
          node_id.find_first_not_of("0123456789", 4) != std::string::npos) {
        return "";
      }
      return "rack" + std::to_string(std::stoi(node_id.substr(4)) / per_rack);
    };
    launcher->PutNodesInRacks(rack_of);
    if (fabric) {
      NetnsFabric* f = fabric.get();
      launcher->PlaceNodesWith([f, rack_of](const std::string& node_id) { return f->AddNode(node_id, rack_of(node_id)); });
      std::fprintf(stderr, "trainguard: --netns: nodes in their own network namespaces on %s.0/24, bridge %s\n",
                   f->gateway().substr(0, f->gateway().rfind('.')).c_str(), f->gateway().c_str());
    }
    if (slurm != nullptr) {
      const std::map<std::string, std::string> step_env = {{"TRAINGUARD_JOB_SECRET", secret}};
      const SlurmSetup* s = slurm;
      launcher->PlaceNodesWith([s, step_env](const std::string& node_id) -> StatusOr<NodeHost> {
        auto node = s->nodes.find(node_id);
        if (node == s->nodes.end()) return NotFound("node " + node_id + " is not in the Slurm allocation");
        return SlurmPlacement(node->second, step_env);
      });
      std::map<std::string, std::string> addresses;
      for (const auto& [name, node] : slurm->nodes) addresses[name] = node.address.empty() ? name : node.address;
      slurm_nodes = std::make_unique<SlurmNodes>(launcher.get(), job_id, addresses, slurm->slurmd_port);
    }
    // The launcher (behind Slurm's, with --scheduler slurm) is the
    // controller's node provider from here on.
    if (slurm_nodes) {
      controller.SetNodeProvider(slurm_nodes.get());
    } else {
      controller.SetNodeProvider(launcher.get());
    }
    if (pick_local_nodes && o.spares == 0 && (o.min_nnodes == 0 || o.min_nnodes == o.nnodes)) {
      // No spares and a fixed size: an evicted node is replaced by a new
      // one, as a scheduler would allocate it. An elastic job (--nnodes
      // MIN:MAX) goes on with fewer instead: its allocation is what `run` started.
      int next = local_nodes.empty() ? 0 : std::stoi(local_nodes.back().node_id.substr(4)) + 1;
      EventStore* s = store->get();
      launcher->ReplaceEvictedNodesWith([next, s]() mutable {
        for (;; ++next) {
          std::string id = "node" + std::to_string(next);
          auto health = s->GetNodeHealth(id);
          if (!health.ok() || health->status != "cordoned") return "node" + std::to_string(next++);
        }
      });
    }
    auto start = [&](const LocalNode& node) {
      std::vector<std::string> node_args = {"--address", node.address};
      if (node.group_rank >= 0 || starts_nodes) {  // a spare asks for no group rank (-1)
        node_args.insert(node_args.end(), {"--group-rank", std::to_string(node.group_rank)});
      }
      launcher->StartNode(node.node_id, node_args);
    };
    for (const LocalNode& node : local_nodes) {
      if (!starts_nodes || node.group_rank >= 0) start(node);
    }
    // Spares join once the job's nodes have started generation 0: agents
    // race to register, and a spare must not take a job node's group rank.
    if (starts_nodes && o.spares > 0) {
      while (!controller.finished() && controller.state() == JobState::kStarting) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (const LocalNode& node : local_nodes) {
        if (node.group_rank < 0 && !controller.finished()) start(node);
      }
    }
  }
  controller.WaitFinished(std::chrono::hours(24 * 365));
  ticking = false;
  ticker.join();
  for (const auto& w : webhooks) {
    if (!w->Flush(15 * kSecond)) {
      std::fprintf(stderr, "trainguard: warning: alerts to %s still undelivered at exit\n", w->url().c_str());
    }
  }
  if (launcher) {
    controller.SetNodeProvider(nullptr);
    if (slurm_nodes) slurm_nodes->Flush(30000);  // the drains asked for are done before the job ends
    launcher->StopAll(static_cast<int>(o.stop_grace_s * 1000) + 15000);
    // Agents that were killed (lost nodes) could not remove their ranks'
    // status pages; every agent of this job is gone now.
    std::error_code ec;
    std::string prefix = "trainguard-" + job_id + "-";
    // With every node here (`run`), every page of the job goes, those of
    // nodes that replaced evicted ones included; else only this host's node's.
    for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
      std::string name = entry.path().filename().string();
      bool ours = pick_local_nodes && name.rfind(prefix, 0) == 0;
      for (const LocalNode& node : local_nodes) ours |= name.rfind(prefix + node.node_id + "-r", 0) == 0;
      if (ours) fs::remove(entry.path(), ec);
    }
  }
  server.Shutdown(2000);
  // Every event in the store before it is read back; a store that is away
  // gets the drain's time (then what is left is named on stderr).
  if (!controller.FlushStore(std::chrono::milliseconds(static_cast<std::int64_t>(o.store_drain_timeout_s * 1000)))) {
    const StoreWriter::Stats w = controller.StoreStats();
    std::fprintf(stderr, "trainguard: warning: %lld write(s) not yet in the store %s after %.0f s (%s)\n",
                 static_cast<long long>(w.queued), StoreDisplayName(o.store).c_str(), o.store_drain_timeout_s,
                 w.last_error.c_str());
  }
  bool ok = controller.state() == JobState::kSucceeded;
  std::fprintf(stderr, "trainguard: %s\n", controller.summary().c_str());
  PrintDowntime(store->get(), job_id);
  if (!ok) {
    if (auto events = store->get()->Events(job_id); events.ok()) {
      for (const auto& line : RootCauseLines(*events)) {
        std::fprintf(stderr, "trainguard: %s\n", line.c_str());
      }
    }
    std::fprintf(stderr, "trainguard: rank logs are in %s; events: trainguard events --store %s %s\n",
                 run_dir.c_str(), StoreDisplayName(o.store).c_str(), job_id.c_str());
  }
  if (ok) return 0;
  // A shell's convention for a run that a signal ended (130 for Ctrl-C);
  // otherwise what the failing rank exited with (FailureExitStatus).
  if (interrupted_by.load() != 0) return 128 + interrupted_by.load();
  return controller.FailureExitStatus();
}

}  // namespace

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
  o.spares = static_cast<int>(nodes.size()) - o.nnodes;
  std::fprintf(stderr, "trainguard: Slurm job %s: %d node(s) for the job, %d spare(s); the controller runs on %s\n",
               allocation->job_id.c_str(), o.nnodes, o.spares, allocation->this_node.c_str());
  return Supervise(o, "0.0.0.0:0", nodes, false, false, &setup);
}

}  // namespace

std::string ValidateJob(const JobOptions& o) {
  if (o.command.empty()) return "no command given: trainguard run [options] -- COMMAND [ARGS...]";
  if (o.nnodes < 1) return "--nnodes must be at least 1";
  if (o.min_nnodes < 0 || o.min_nnodes > o.nnodes) return "--nnodes MIN:MAX needs 1 <= MIN <= MAX";
  if (o.elastic_wait_s < 0) return "--elastic-wait must not be negative";
  if (o.nproc_per_node < 1) return "--nproc-per-node must be at least 1";
  if (o.max_restarts < 0) return "--max-restarts must not be negative";
  if (o.spares < 0) return "--spares must not be negative";
  if (o.nodes_per_rack < 0) return "--nodes-per-rack must not be negative";
  if (o.diagnose != "off" && o.diagnose != "quick" && o.diagnose != "full") {
    return "--diagnose must be off, quick or full, not '" + o.diagnose + "'";
  }
  if (o.diag_timeout_s <= 0) return "--diag-timeout must be positive";
  if (o.straggler_threshold <= 0 || o.straggler_window < 1 || o.straggler_evict_windows < 2) {
    return "--straggler-threshold must be positive, --straggler-window at least 1 and "
           "--straggler-evict-windows at least 2";
  }
  if (o.link_flaps_to_evict < 0 || o.link_flap_window_s <= 0) {
    return "--link-flaps-to-evict must not be negative and --link-flap-window must be positive";
  }
  for (const auto& p : o.diag_paths) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == p.size()) {
      return "--diag-path '" + p + "' is not ROLE=DIR (e.g. checkpoint=/ckpt)";
    }
  }
  if (o.hang_timeout_s <= 0 || o.startup_timeout_s <= 0 || o.hang_timeout_floor_s <= 0) {
    return "timeouts must be positive";
  }
  if (o.heartbeat_interval_s <= 0 || o.missed_heartbeats < 1) {
    return "--heartbeat-interval must be positive and --missed-heartbeats at least 1";
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
                   : "/tmp/trainguard/" + (o.job_id.empty() ? "rdzv-" + std::to_string(port) : o.job_id);
  a.connect_timeout_s = o.rendezvous_timeout_s;
  a.native_stacks = o.native_stacks;
  a.exit_with_job = true;
  a.secret_file = o.secret_file;
  a.reconnect_window_s = o.reconnect_window_s;
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
                      {"max_restarts", options.max_restarts},
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

int RunAgent(const AgentOptions& o) {
  AgentConfig config;
  config.node_id = o.node_id.empty() ? Hostname() : o.node_id;
  config.hostname = Hostname();
  std::string host = o.controller.substr(0, o.controller.rfind(':'));
  if (o.controller.find(':') == std::string::npos) {
    std::fprintf(stderr, "trainguard agent: error: --controller must be HOST:PORT, got '%s'\n",
                 o.controller.c_str());
    return 2;
  }
  bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]";
  std::string toward;
  if (o.address.empty() && !loopback) {
    std::string h;
    int port = -1;
    SplitHostPort(o.controller, &h, &port);
    toward = LocalAddressToward(h);  // the address this host reaches the controller from
  }
  config.address = !o.address.empty() ? o.address
                   : loopback          ? "127.0.0.1"
                   : !toward.empty()   ? toward
                                       : Hostname();
  config.run_dir = o.run_dir.empty() ? o.run_dir_base + "/" + config.node_id : o.run_dir;
  config.python_dir = PythonDir();
  config.rack = !o.rack.empty() ? o.rack : std::getenv("TRAINGUARD_RACK") != nullptr ? std::getenv("TRAINGUARD_RACK") : "";
  config.native_stacks = o.native_stacks;
  config.preferred_group_rank = o.group_rank;
  config.reconnect_window = static_cast<Nanos>(o.reconnect_window_s * kSecond);
  // The job's secret, shown when registering: --secret-file, else
  // $TRAINGUARD_SECRET_FILE, else $TRAINGUARD_JOB_SECRET (how `run
  // --scheduler slurm` hands it to its steps; not passed on to the ranks).
  if (const char* given = std::getenv("TRAINGUARD_JOB_SECRET")) {
    config.job_secret = given;
    unsetenv("TRAINGUARD_JOB_SECRET");
  }
  const char* secret_env = std::getenv("TRAINGUARD_SECRET_FILE");
  const std::string secret_file = !o.secret_file.empty() ? o.secret_file : secret_env != nullptr ? secret_env : "";
  if (!secret_file.empty()) {
    auto secret = ReadJobSecret(secret_file);
    if (!secret.ok()) {
      std::fprintf(stderr, "trainguard agent %s: error: --secret-file: %s\n", config.node_id.c_str(),
                   secret.status().message().c_str());
      return 2;
    }
    config.job_secret = *secret;
  }
  config.stream_output = !o.quiet;
  if (o.protocol_version != 0) config.protocol_version = o.protocol_version;
  // The shipped rules' fatal and warning patterns, scanned on every line.
  if (auto rules = LoadRulesFor({}); rules.ok()) {
    config.scan_rules = std::make_shared<const RuleSet>(std::move(rules.value()));
  } else {
    std::fprintf(stderr, "trainguard agent %s: warning: no line scanning: %s\n",
                 config.node_id.c_str(), rules.status().message().c_str());
  }

  // Before any thread exists (see Supervise).
  std::atomic<int> interrupted_by{0};
  std::atomic<Agent*> running{nullptr};
  SignalWatcher signals([&](int sig) {
    interrupted_by = sig;
    if (Agent* a = running.load()) a->Interrupt(std::string("agent interrupted by signal ") + strsignal(sig));
  });
  GrpcControllerLink link;
  Agent agent(config, RealClock::Get(), &link);
  running = &agent;
  // Said once the watcher is up: from here on Ctrl-C ends the wait cleanly.
  // (Agents that `run` starts next to its controller say nothing.)
  if (!loopback || o.exit_with_job) std::fprintf(stderr, "trainguard: node %s (%s%s) joins the controller at %s\n",
               config.node_id.c_str(), config.address.c_str(),
               o.group_rank >= 0 ? (", node rank " + std::to_string(o.group_rank)).c_str() : "",
               o.controller.c_str());
  Status connected = link.Connect(o.controller, static_cast<int>(o.connect_timeout_s * 1000),
                                  [&] { return interrupted_by.load() != 0; }, o.tls_ca);
  if (interrupted_by.load() != 0) return 128 + interrupted_by.load();
  if (!connected.ok()) {
    std::fprintf(stderr, "trainguard agent %s: error: %s\n", config.node_id.c_str(),
                 connected.message().c_str());
    return 2;
  }
  link.Attach(&agent);
  int rc = agent.Run();
  if (rc != 0 && interrupted_by.load() == 0) {
    std::fprintf(stderr, "trainguard agent %s: error: %s\n", config.node_id.c_str(),
                 agent.error().c_str());
  }
  link.Close();
  if (interrupted_by.load() != 0) return 128 + interrupted_by.load();
  if (rc == 0 && o.exit_with_job) return agent.job_exit_status();
  return rc;
}

}  // namespace trainguard
