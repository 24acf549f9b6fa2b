// Supervise: a job's controller (store, rules, API, alerts, the gRPC
// server, the ticker) and the agents this process starts beside it, from
// the start until the job ends and its record is read back.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
#include "common/status_page.h"
#include "controller/job_controller.h"
#include "controller/leadership.h"
#include "store/event_store.h"
#include "transport/grpc_transport.h"

#include "cli/supervise.h"

namespace trainguard {

namespace fs = std::filesystem;
using nlohmann::json;

// The knobs as their flags set them (controller/job_knobs.h), and the job.
JobConfig MakeConfig(const JobOptions& o, const std::string& job_id) {
  JobConfig c = o.knobs;
  c.job_id = job_id;
  c.nnodes = o.nnodes;
  c.min_nnodes = o.min_nnodes;
  c.nproc_per_node = o.nproc_per_node;
  c.argv = o.command;
  c.env = o.env;
  c.diag_paths = o.diag_paths;
  c.diag_parallelism = std::max(o.diag_parallel, 0);
  // The ticker below runs every kTickInterval: twenty missed ticks mean the
  // controller itself did not run.
  c.watch_gap_grace = 20 * kTickInterval;
  return c;
}

namespace {

void PrintDowntime(EventStore* store, const std::string& job_id) {
  auto events = store->Events(job_id);
  if (!events.ok()) return;
  for (const auto& e : *events) {
    if (e.kind == "attribution" || e.kind == "decision" || e.kind == "downtime") {
      std::fprintf(stderr, "trainguard:   %s\n", e.message.c_str());
    }
  }
}

std::vector<std::string>& CommandLine() {
  static std::vector<std::string> line;
  return line;
}

// A controller whose lead passed becomes a standby of its job again: the
// same command line in a fresh image of this process (the same PID; none
// of the old controller's state, threads or connections is kept: every
// descriptor but stdin, stdout and stderr is made close-on-exec first, so
// its ports are free and its sessions end). If that cannot be done, it
// exits kSteppedDown.
[[noreturn]] void StandByAgain() {
  const std::vector<std::string>& line = CommandLine();
  if (!line.empty()) {
    std::vector<char*> argv;
    for (const std::string& a : line) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(stdout);
    // This thread blocks SIGINT and SIGTERM (SignalWatcher): the new image
    // must not inherit that while it waits as a standby.
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    // Not every library marks its descriptors close-on-exec (a listening
    // socket kept open would hold its port, and its callers would hang).
    // Marked, not closed: other threads still use them until the exec.
    if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {  // before Linux 5.11: one by one
      const long most = std::min<long>(sysconf(_SC_OPEN_MAX), 1 << 16);
      for (int fd = 3; fd < most; ++fd) {
        const int flags = fcntl(fd, F_GETFD);
        if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
      }
    }
    execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "trainguard: could not start again as a standby (%s): exiting\n", std::strerror(errno));
  }
  std::_Exit(kSteppedDown);
}

// Waits as a standby until this process leads `job_id` (its own store
// connection: renewals must not wait behind reads or writes), then fences
// `write_store` to the lead and stamps it on `config`. -1: go on and lead;
// else the exit status (the job has ended: nothing to take over; 2: no store).
int Lead(const std::string& where, const std::string& job_id, EventStore* store, EventStore* write_store,
         JobConfig* config, std::unique_ptr<Leadership>* lead) {
  auto own = OpenEventStore(where);
  if (!own.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", own.status().message().c_str());
    return 2;
  }
  *lead = std::make_unique<Leadership>(std::move(own.value()), job_id, Leadership::Holder(), kLeadTtl);
  (*lead)->WaitToLead(nullptr);
  if (auto jobs = store->Jobs(); jobs.ok()) {
    for (const auto& j : *jobs) {
      if (j.job_id == job_id && (j.state == "SUCCEEDED" || j.state == "FAILED")) {
        std::fprintf(stderr, "trainguard: job %s has ended (%s): nothing to take over\n", job_id.c_str(),
                     j.state.c_str());
        return j.state == "SUCCEEDED" ? 0 : 1;
      }
    }
  }
  config->lead_epoch = (*lead)->epoch();
  write_store->FenceWrites(job_id, (*lead)->epoch());
  return -1;
}

}  // namespace

void RememberCommandLine(int argc, char** argv) { CommandLine().assign(argv, argv + argc); }

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


namespace {

int Refuse(const std::string& message) {
  std::fprintf(stderr, "trainguard: error: %s\n", message.c_str());
  return 2;
}

// The job's secret: agents show it when they register, API actions take it
// as their token. From --secret-file, or new (written to the run dir once
// the job is recorded).
struct JobSecret {
  std::string value;
  std::string path;
  bool made = false;  // new: to be written to `path`
};

StatusOr<JobSecret> SecretOf(const JobOptions& o, const std::string& run_dir) {
  if (!o.secret_file.empty()) {
    auto read = ReadJobSecret(o.secret_file);
    if (!read.ok()) return InvalidArgument("--secret-file: " + read.status().message());
    return JobSecret{*read, o.secret_file, false};
  }
  auto made = NewJobSecret();
  if (!made.ok()) return made.status();
  return JobSecret{*made, run_dir + "/job-secret", true};
}

// `controller` on the store of a job that has not ended takes it back (its
// controller died, or this is a standby that took the lead): agents that
// kept their ranks reconnect.
bool ShouldResume(EventStore* store, const std::string& job_id) {
  auto jobs = store->Jobs();
  if (!jobs.ok()) return false;
  for (const auto& j : *jobs) {
    if (j.job_id == job_id && j.state != "SUCCEEDED" && j.state != "FAILED") return true;
  }
  return false;
}

// The agents this process starts, and the backend that drives them.
struct Nodes {
  std::unique_ptr<SlurmNodes> slurm_nodes;  // goes before the launcher it drives
  std::unique_ptr<LocalLauncher> launcher;
};

// Where the nodes run and what they are told: the controller's address and
// secret, their racks, their network namespaces or Slurm steps; the
// launcher becomes the controller's node provider.
void MakeLauncher(const JobOptions& o, const std::string& job_id, const std::string& controller_address,
                  const std::string& run_dir, const JobSecret& secret, const SlurmSetup* slurm, NetnsFabric* fabric,
                  EventStore* store, bool replace_evicted, int next_node, JobController* controller, Nodes* nodes) {
  std::vector<std::string> args = {"--controller", controller_address, "--run-dir-base", run_dir,
                                   "--connect-timeout", "30", "--reconnect-window",
                                   std::to_string((o.knobs.reconnect_window / static_cast<double>(kSecond)))};
  // Agents on this host read the secret's file; steps on other nodes get
  // it in their environment (never on a command line).
  if (slurm == nullptr) args.insert(args.end(), {"--secret-file", secret.path});
  // With TLS, its own agents trust --tls-ca, else the certificate itself (self-signed).
  const std::string trust = !o.tls_ca.empty() ? o.tls_ca : o.tls_cert;
  if (!trust.empty()) args.insert(args.end(), {"--tls-ca", trust});
  if (o.native_stacks) args.push_back("--native-stacks");
  nodes->launcher = std::make_unique<LocalLauncher>(SelfExe(), args);
  LocalLauncher* launcher = nodes->launcher.get();
  const int per_rack = o.nodes_per_rack;
  auto rack_of = [per_rack](const std::string& node_id) -> std::string {
    if (per_rack <= 0 || node_id.rfind("node", 0) != 0 || node_id.size() <= 4 ||
        node_id.find_first_not_of("0123456789", 4) != std::string::npos) {
      return "";
    }
    return "rack" + std::to_string(std::stoi(node_id.substr(4)) / per_rack);
  };
  launcher->PutNodesInRacks(rack_of);
  if (fabric != nullptr) {
    launcher->PlaceNodesWith([fabric, rack_of](const std::string& node_id) {
      return fabric->AddNode(node_id, rack_of(node_id));
    });
    std::fprintf(stderr, "trainguard: --netns: nodes in their own network namespaces on %s.0/24, bridge %s\n",
                 fabric->gateway().substr(0, fabric->gateway().rfind('.')).c_str(), fabric->gateway().c_str());
  }
  if (slurm != nullptr) {
    const std::map<std::string, std::string> step_env = {{"TRAINGUARD_JOB_SECRET", secret.value}};
    launcher->PlaceNodesWith([slurm, step_env](const std::string& node_id) -> StatusOr<NodeHost> {
      auto node = slurm->nodes.find(node_id);
      if (node == slurm->nodes.end()) return NotFound("node " + node_id + " is not in the Slurm allocation");
      return SlurmPlacement(node->second, step_env);
    });
    std::map<std::string, std::string> addresses;
    for (const auto& [name, node] : slurm->nodes) addresses[name] = node.address.empty() ? name : node.address;
    nodes->slurm_nodes = std::make_unique<SlurmNodes>(launcher, job_id, addresses, slurm->slurmd_port);
  }
  // The launcher (behind Slurm's, with --scheduler slurm) is the
  // controller's node provider from here on.
  if (nodes->slurm_nodes) {
    controller->SetNodeProvider(nodes->slurm_nodes.get());
  } else {
    controller->SetNodeProvider(launcher);
  }
  if (replace_evicted) {
    // No spares and a fixed size: an evicted node is replaced by a new
    // one, as a scheduler would allocate it. An elastic job (--nnodes
    // MIN:MAX) goes on with fewer instead: its allocation is what `run` started.
    launcher->ReplaceEvictedNodesWith([next = next_node, store]() mutable {
      for (;; ++next) {
        std::string id = "node" + std::to_string(next);
        auto health = store->GetNodeHealth(id);
        if (!health.ok() || health->status != "cordoned") return "node" + std::to_string(next++);
      }
    });
  }
}

// Starts the agents: every node `run` starts itself asks for its group rank
// (a spare for none, -1), and spares join once the job's nodes have started
// generation 0: agents race to register, and a spare must not take a job
// node's group rank.
void StartNodes(const std::vector<LocalNode>& local_nodes, bool starts_nodes, int spares, LocalLauncher* launcher,
                JobController* controller) {
  auto start = [&](const LocalNode& node) {
    std::vector<std::string> node_args = {"--address", node.address};
    if (node.group_rank >= 0 || starts_nodes) node_args.insert(node_args.end(), {"--group-rank", std::to_string(node.group_rank)});
    launcher->StartNode(node.node_id, node_args);
  };
  for (const LocalNode& node : local_nodes) {
    if (!starts_nodes || node.group_rank >= 0) start(node);
  }
  if (!starts_nodes || spares <= 0) return;
  while (!controller->finished() && controller->state() == JobState::kStarting) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const LocalNode& node : local_nodes) {
    if (node.group_rank < 0 && !controller->finished()) start(node);
  }
}

// After the job ended: the agents this process started are stopped.
void StopNodes(const JobOptions& o, const std::string& job_id, JobController* controller, Nodes* nodes) {
  if (nodes->launcher) {
    controller->SetNodeProvider(nullptr);
    if (nodes->slurm_nodes) nodes->slurm_nodes->Flush(30000);  // the drains asked for are done before the job ends
    nodes->launcher->StopAll(static_cast<int>(o.knobs.stop_grace / kMillisecond) + 15000);
    // Agents that were killed (lost nodes) could not remove their ranks'
    // status pages; every agent of this job here is gone now. A page in use
    // is locked by its agent: those of another job of the same id on this
    // host stay.
    RemoveStalePages("/dev/shm", "trainguard-" + job_id + "-");
  }
}

// Then every event in the store, what happened said on stderr; the exit
// status `run` gives.
int Conclude(const JobOptions& o, const std::string& job_id, const std::string& run_dir, EventStore* store,
             JobController* controller, int interrupted_by) {
  // Every event in the store before it is read back; a store that is away
  // gets the drain's time (then what is left is named on stderr).
  if (!controller->FlushStore(std::chrono::milliseconds(static_cast<std::int64_t>(o.store_drain_timeout_s * 1000)))) {
    const StoreWriter::Stats w = controller->StoreStats();
    std::fprintf(stderr, "trainguard: warning: %lld write(s) not yet in the store %s after %.0f s (%s)\n",
                 static_cast<long long>(w.queued), StoreDisplayName(o.store).c_str(), o.store_drain_timeout_s,
                 w.last_error.c_str());
  }
  const bool ok = controller->state() == JobState::kSucceeded;
  std::fprintf(stderr, "trainguard: %s\n", controller->summary().c_str());
  PrintDowntime(store, job_id);
  if (!ok) {
    if (auto events = store->Events(job_id); events.ok()) {
      for (const auto& line : RootCauseLines(*events)) std::fprintf(stderr, "trainguard: %s\n", line.c_str());
    }
    std::fprintf(stderr, "trainguard: rank logs are in %s; events: trainguard events --store %s %s\n",
                 run_dir.c_str(), StoreDisplayName(o.store).c_str(), job_id.c_str());
  }
  if (ok) return 0;
  // A shell's convention for a run that a signal ended (130 for Ctrl-C);
  // otherwise what the failing rank exited with (FailureExitStatus).
  if (interrupted_by != 0) return 128 + interrupted_by;
  return controller->FailureExitStatus();
}

}  // namespace

int Supervise(const JobOptions& o, const std::string& listen, std::vector<LocalNode> local_nodes,
              bool endpoint_may_be_taken, bool pick_local_nodes, const SlurmSetup* slurm) {
  // `run` starts every node itself: on this host, or as steps of a Slurm allocation.
  const bool starts_nodes = pick_local_nodes || slurm != nullptr;
  // `controller` alone (no agents of its own) with a --job-id: a job it may take back, or lead as a standby.
  const bool controller_only = !pick_local_nodes && local_nodes.empty() && !o.job_id.empty();
  if (std::string error = ValidateJob(o); !error.empty()) return Refuse(error);
  // --netns without what it needs: said first, in one line.
  const std::string netns_unavailable = pick_local_nodes && o.netns ? NetnsFabric::Unavailable() : "";
  if (!netns_unavailable.empty() && !o.netns_fallback) {
    return Refuse(netns_unavailable + " (--netns-fallback runs the nodes in this host's network instead)");
  }
  // The default store's per-user directory is made on first use; a --store
  // in a directory that does not exist is an error, as the user wrote it.
  if (o.store == DefaultStorePath()) {
    std::error_code dir_error;
    fs::create_directories(fs::path(o.store).parent_path(), dir_error);
  }
  auto store = OpenEventStore(o.store);
  if (!store.ok()) return Refuse(store.status().message());
  // The controller's writer thread has a connection of its own: a write that
  // waits on the server (a locked file, a restarting PostgreSQL) never holds
  // up the controller's reads (store/store_writer.h).
  auto write_store = OpenEventStore(o.store);
  if (!write_store.ok()) return Refuse(write_store.status().message());
  auto rules = LoadRulesFor(o.extra_rules);
  if (!rules.ok()) return Refuse(rules.status().message());
  if (pick_local_nodes) local_nodes = PickLocalNodes(store->get(), o.nnodes, o.knobs.spares);
  std::string job_id = o.job_id.empty() ? DefaultJobId() : o.job_id;
  JobConfig config = MakeConfig(o, job_id);
  // A `controller` of a job on PostgreSQL leads it only once it holds the
  // job's lead in the store; until then it is a standby (docs/standby.md).
  std::unique_ptr<Leadership> lead;
  if (controller_only && slurm == nullptr && IsPostgresUrl(o.store)) {
    if (int ended = Lead(o.store, job_id, store->get(), write_store->get(), &config, &lead); ended >= 0) return ended;
  }
  // Nodes that share this host must not measure each other.
  if (o.diag_parallel < 0 && pick_local_nodes) config.diag_parallelism = 1;
  std::string run_dir = o.run_dir.empty() ? DefaultRunDirBase() + "/" + job_id : o.run_dir;
  auto secret = SecretOf(o, run_dir);
  if (!secret.ok()) return Refuse(secret.status().message());
  // Agents are checked when the secret came from a file, or when `run` starts every node itself.
  const bool agents_checked = !o.secret_file.empty() || starts_nodes;
  if (agents_checked) config.agent_secret = secret->value;
  // --http: bound before the controller exists, so that the job's record
  // says where its API is; it serves once the job is recorded.
  std::unique_ptr<HttpApi> api;
  if (o.http != "off") {
    HttpApiOptions api_options;
    api_options.listen = o.http;
    api_options.token = secret->value;
    api = std::make_unique<HttpApi>(store->get(), api_options);
    if (Status bound = api->Bind(); !bound.ok()) return Refuse(bound.message());
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
    if (!sender.ok()) return Refuse("--alert-webhook: " + sender.status().message());
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
      if (Status made = fabric->Create(); !made.ok()) return Refuse("--netns: " + made.message());
      listen_on = fabric->gateway() + ":0";
      controller_host = fabric->gateway();
    }
  }
  Nodes nodes;

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
    return Refuse(listening.message());
  }
  const bool resume = controller_only && ShouldResume(store->get(), job_id);
  if (resume) {
    std::fprintf(stderr, "trainguard: job %s is in %s and has not ended: taking it back (its agents have %.0f s "
                         "to reconnect)\n",
                 job_id.c_str(), StoreDisplayName(o.store).c_str(), (o.knobs.reconnect_window / static_cast<double>(kSecond)));
  }
  if (Status started = resume ? controller.Resume() : controller.Start(); !started.ok()) {
    return Refuse(started.message());
  }
  if (secret->made) {
    if (Status written = WriteJobSecret(secret->path, secret->value); !written.ok()) {
      controller.Cancel("the job secret could not be written");
      return Refuse(written.message());
    }
  }
  if (!agents_checked) {
    std::fprintf(stderr, "trainguard: note: agents are not authenticated; give the controller and every agent "
                         "--secret-file FILE (the same secret) to refuse strangers\n");
  }
  if (api) {
    api->Serve(&controller);
    std::fprintf(stderr, "trainguard: job %s: API and metrics at %s (actions need the job secret in %s)\n",
                 job_id.c_str(), api->url().c_str(), secret->path.c_str());
  }
  if (lead) {
    // Another controller took the lead (this one was paused or cut off, or
    // a write of it was fenced off): it acts on nothing more; the new
    // leader has the job, and the agents follow it. This one stands by
    // again, for the next loss.
    lead->KeepRenewing(write_store->get(), [job_id](const std::string& why) {
      std::fprintf(stderr, "trainguard: job %s: %s: this controller steps down (it writes and commands nothing "
                           "more) and stands by again\n", job_id.c_str(), why.c_str());
      std::fflush(stderr);
      StandByAgain();
    });
  }
  std::atomic<bool> ticking{true};
  std::thread ticker([&] {
    while (ticking.load() && !controller.finished()) {
      controller.Tick();
      std::this_thread::sleep_for(std::chrono::nanoseconds(kTickInterval));
    }
  });
  std::fprintf(stderr, "trainguard: job %s: controller on port %d, %d node(s) x %d rank(s), store %s\n",
               job_id.c_str(), server.port(), o.nnodes, o.nproc_per_node, StoreDisplayName(o.store).c_str());
  if (!local_nodes.empty()) {
    const bool replace_evicted =
        pick_local_nodes && o.knobs.spares == 0 && (o.min_nnodes == 0 || o.min_nnodes == o.nnodes);
    // `run`'s nodes are node<i>: a new one is the next i.
    const int next_node = replace_evicted ? std::stoi(local_nodes.back().node_id.substr(4)) + 1 : 0;
    MakeLauncher(o, job_id, controller_host + ":" + std::to_string(server.port()), run_dir, *secret, slurm,
                 fabric.get(), store->get(), replace_evicted, next_node, &controller, &nodes);
    StartNodes(local_nodes, starts_nodes, o.knobs.spares, nodes.launcher.get(), &controller);
  }
  controller.WaitFinished(std::chrono::hours(24 * 365));
  ticking = false;
  ticker.join();
  for (const auto& w : webhooks) {
    if (!w->Flush(15 * kSecond)) {
      std::fprintf(stderr, "trainguard: warning: alerts to %s still undelivered at exit\n", w->url().c_str());
    }
  }
  StopNodes(o, job_id, &controller, &nodes);
  server.Shutdown(2000);
  return Conclude(o, job_id, run_dir, store->get(), &controller, interrupted_by.load());
}

}  // namespace trainguard
