// `trainguard agent`: one node's agent, connected to its job's controller.
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

int RunAgent(const AgentOptions& o) {
  AgentConfig config;
  config.node_id = o.node_id.empty() ? Hostname() : o.node_id;
  config.hostname = Hostname();
  // HOST:PORT, or several (a leader and its standbys, docs/standby.md):
  // this host's address is derived from the first.
  for (std::size_t from = 0; from <= o.controller.size();) {
    std::size_t comma = o.controller.find(',', from);
    if (comma == std::string::npos) comma = o.controller.size();
    const std::string one = o.controller.substr(from, comma - from);
    if (one.find(':') == std::string::npos) {
      std::fprintf(stderr, "trainguard agent: error: --controller must be HOST:PORT[,HOST:PORT...], got '%s'\n",
                   o.controller.c_str());
      return 2;
    }
    from = comma + 1;
  }
  const std::string first = o.controller.substr(0, o.controller.find(','));
  std::string host = first.substr(0, first.rfind(':'));
  bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]";
  std::string toward;
  if (o.address.empty() && !loopback) {
    std::string h;
    int port = -1;
    SplitHostPort(first, &h, &port);
    toward = LocalAddressToward(h);  // the address this host reaches the controller from
  }
  config.address = !o.address.empty() ? o.address
                   : loopback          ? "127.0.0.1"
                   : !toward.empty()   ? toward
                                       : Hostname();
  config.run_dir = !o.run_dir.empty()        ? o.run_dir
                   : !o.run_dir_base.empty() ? o.run_dir_base + "/" + config.node_id
                                             : DefaultRunDirBase() + "/" + config.node_id;
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
