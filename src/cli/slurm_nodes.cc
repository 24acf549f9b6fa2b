#include "cli/slurm_nodes.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "diag/net_probe.h"

namespace trainguard {

NodeHost SlurmPlacement(const SlurmNodeInfo& node, const std::map<std::string, std::string>& extra_env) {
  NodeHost host;
  // One task on that node, sharing the allocation's resources with the
  // others (--overlap: the ranks it starts are not confined to one CPU of a
  // step of their own); the step outlives the failure of another (no
  // --kill-on-bad-exit). $TRAINGUARD_SRUN_ARGS adds the site's own (GPUs,
  // CPU binding): docs/slurm.md.
  host.prefix = {"srun", "--nodes=1", "--ntasks=1", "--nodelist=" + node.name, "--overlap", "--mem=0",
                 "--kill-on-bad-exit=0", "--quiet", "--job-name=trainguard-agent-" + node.name};
  if (const char* extra = std::getenv("TRAINGUARD_SRUN_ARGS")) {
    std::istringstream in(extra);
    for (std::string arg; in >> arg;) host.prefix.push_back(arg);
  }
  host.address = node.address.empty() ? node.name : node.address;
  host.env = extra_env;
  return host;
}

SlurmNodes::SlurmNodes(LocalLauncher* launcher, std::string job_id, std::map<std::string, std::string> addresses,
                       int slurmd_port)
    : launcher_(launcher), job_id_(std::move(job_id)), addresses_(std::move(addresses)), slurmd_port_(slurmd_port) {
  // srun passes SIGTERM on to the step (the agent stops its ranks and
  // exits); SIGKILL would leave the step running on its node.
  launcher_->StopAgentsWith(SIGTERM, 15000);
  drainer_ = std::thread([this] { DrainLoop(); });
}

SlurmNodes::~SlurmNodes() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  drainer_.join();
}

void SlurmNodes::ReplaceNode(const std::string& node_id, const std::string& reason) {
  launcher_->ReplaceNode(node_id, reason);
}

bool SlurmNodes::EvictNode(const std::string& node_id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drains_.emplace_back(node_id, DrainReason(job_id_, reason));
    cv_.notify_all();
  }
  launcher_->EvictNode(node_id, reason);  // stops the node's step; nothing replaces it
  return false;
}

LossExplanation SlurmNodes::ExplainLoss(const std::string& node_id) {
  auto node = Slurm::Node(node_id, 3 * kSecond);  // bounded: the decision on the incident waits for it
  if (node.ok() && node->Failed()) {
    return {"Slurm reports node " + node_id + " " + node->state +
                (node->reason.empty() ? "" : " (" + node->reason + ")"),
            HostDownVerdict(node_id)};
  }
  // slurmctld notices a dead host only after SlurmdTimeout; its slurmd can
  // be asked now (a bounded connect, off the controller's lock like all of this).
  auto address = addresses_.find(node_id);
  if (slurmd_port_ > 0 && address != addresses_.end()) {
    const std::string silent = TcpAnswers(address->second + ":" + std::to_string(slurmd_port_), 1 * kSecond);
    if (!silent.empty()) {
      return {"Slurm's daemon on node " + node_id + " does not answer (" + silent + "): its host is down or cut off",
              HostDownVerdict(node_id)};
    }
  }
  // The host is up: what the agent's step said when it ended (srun's exit
  // status), if it has ended.
  return launcher_->ExplainLoss(node_id);
}

void SlurmNodes::Flush(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return drains_.empty() && draining_ == 0; });
}

void SlurmNodes::DrainLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !drains_.empty(); });
    if (drains_.empty()) return;  // stopping, nothing left
    auto [node, reason] = drains_.front();
    drains_.pop_front();
    ++draining_;
    lock.unlock();
    Status drained = Slurm::Drain(node, reason);
    if (drained.ok()) {
      std::fprintf(stderr, "trainguard: node %s drained in Slurm: %s\n", node.c_str(), reason.c_str());
    } else {
      std::fprintf(stderr, "trainguard: warning: %s; it stays cordoned in trainguard's store\n",
                   drained.message().c_str());
    }
    lock.lock();
    --draining_;
    cv_.notify_all();
  }
}

}  // namespace trainguard
