// LocalLauncher: the `local` scheduler backend. Every "node" is an agent
// process on this machine, started as `trainguard agent ...`. A lost node's
// agent is SIGKILLed (which takes its ranks along through PDEATHSIG) and a
// fresh agent starts under the same node id. An evicted node (cordoned) is
// killed for good; a new node under a fresh id takes its place only when a
// source of fresh ids is set (without spares the local backend stands in for
// a scheduler that allocates a new node; with spares the pool is fixed).
//
// Threading: one launcher thread forks, reaps and kills agents (so that
// PDEATHSIG is tied to a thread that lives as long as the launcher);
// ReplaceNode only queues a request and may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/process.h"
#include "cli/netns_fabric.h"
#include "controller/node_provider.h"

namespace trainguard {

class LocalLauncher final : public NodeProvider {
 public:
  // `agent_argv(node_id)` gives the command line of the agent for a node.
  LocalLauncher(std::string self_exe, std::vector<std::string> common_args);
  ~LocalLauncher() override;

  // Starts the agent of `node_id` with `node_args` after the common ones (and
  // again with them whenever the node is replaced). Node ids "node<N>" ask
  // for group rank N unless `node_args` name one.
  void StartNode(const std::string& node_id, std::vector<std::string> node_args = {});
  // Replaces a node this launcher started; other nodes (agents on other
  // hosts) are not its to replace.
  void ReplaceNode(const std::string& node_id, const std::string& reason) override;
  bool EvictNode(const std::string& node_id, const std::string& reason) override;
  // Where each node's agent runs (its network namespace): called for every
  // launch without the launcher's lock. Unset: on this host, as it is.
  void PlaceNodesWith(std::function<StatusOr<NodeHost>(const std::string& node_id)> place);
  // Where the id of a node that replaces an evicted one comes from ("" =
  // none). Called with the launcher's lock held: must not call back into it.
  void ReplaceEvictedNodesWith(std::function<std::string()> fresh_node_id);
  // The rack of each node it starts (`agent --rack`; "" = none). Set before
  // the first StartNode.
  void PutNodesInRacks(std::function<std::string(const std::string& node_id)> rack_of);
  // How an agent that is replaced or evicted is stopped: `sig` to its
  // process group, SIGKILL after `grace_ms` (default: SIGKILL at once). An
  // agent behind srun is stopped with SIGTERM, which srun passes on to the
  // job step; SIGKILL would leave the step running.
  void StopAgentsWith(int sig, int grace_ms);
  // The agent's exit status when its process has exited (this host is up:
  // it is the one running the launcher): a fault of the agent, not the node.
  LossExplanation ExplainLoss(const std::string& node_id) override;
  // Waits up to `timeout_ms` for all agents to exit, then SIGKILLs the rest
  // and reaps them. Returns the number that had to be killed.
  int StopAll(int timeout_ms);
  // Pid of the node's current agent, -1 if none (tests, benchmarks).
  pid_t AgentPid(const std::string& node_id);

 private:
  struct Request {
    std::string node_id;
    bool kill_first;
    bool launch = true;
  };
  void Loop();
  void Launch(const std::string& node_id, const NodeHost* host);

  const std::string self_exe_;
  const std::vector<std::string> common_args_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> requests_;
  std::map<std::string, std::vector<std::string>> node_args_;  // every node started here
  std::map<std::string, pid_t> agents_;  // live agents by node id
  std::map<std::string, ExitInfo> exits_; // how each node's last agent ended, once reaped
  std::vector<pid_t> dying_;              // killed, not yet reaped
  std::map<pid_t, std::chrono::steady_clock::time_point> soft_kills_;  // SIGKILL at these times
  int stop_signal_ = SIGKILL;
  int stop_grace_ms_ = 0;
  bool stopping_ = false;
  int stop_timeout_ms_ = 0;
  int killed_ = 0;
  bool done_ = false;
  std::function<std::string()> fresh_node_id_;
  std::function<std::string(const std::string&)> rack_of_;
  std::function<StatusOr<NodeHost>(const std::string&)> place_;
  std::thread thread_;
};

}  // namespace trainguard
