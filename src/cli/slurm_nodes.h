// SlurmNodes: the `slurm` scheduler backend (`run --scheduler slurm`, inside
// an sbatch allocation). Each node's agent is a job step of the allocation,
// `srun --nodes=1 --ntasks=1 --nodelist=NODE ... trainguard agent ...`,
// started, replaced and stopped by a LocalLauncher whose placement puts that
// srun in front of the agent (SlurmPlacement). On top of it:
//   - an evicted node is drained in Slurm, with the job and the reason (the
//     incident), so that no job of any user lands on it until an
//     administrator resumes it; the drain runs on a thread of its own (the
//     controller calls EvictNode under its lock);
//   - a lost node is explained with Slurm's view of it (DOWN, NOT_RESPONDING,
//     FAIL: the node failed), else by asking the node's slurmd (no answer: the
//     host is down or cut off; slurmctld says so only after SlurmdTimeout),
//     else by what the agent's step said when it ended.
// docs/slurm.md.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/local_launcher.h"
#include "cli/slurm.h"

namespace trainguard {

// Where a node's agent runs: a step on that node, the agent reachable at the
// node's NodeAddr. `extra_env` goes to the step (srun exports the
// environment), e.g. the job's secret, so that it is never on a command line.
NodeHost SlurmPlacement(const SlurmNodeInfo& node, const std::map<std::string, std::string>& extra_env);

class SlurmNodes final : public NodeProvider {
 public:
  // `addresses`: each node's NodeAddr; `slurmd_port`: where every slurmd
  // listens (0: do not probe).
  SlurmNodes(LocalLauncher* launcher, std::string job_id, std::map<std::string, std::string> addresses,
             int slurmd_port);
  ~SlurmNodes() override;

  void ReplaceNode(const std::string& node_id, const std::string& reason) override;
  // Drains the node in Slurm and stops its step. The allocation's other
  // nodes are the spares: no new node comes (false).
  bool EvictNode(const std::string& node_id, const std::string& reason) override;
  LossExplanation ExplainLoss(const std::string& node_id) override;
  // Waits (bounded) for the drains asked for so far.
  void Flush(int timeout_ms);

 private:
  void DrainLoop();

  LocalLauncher* const launcher_;
  const std::string job_id_;
  const std::map<std::string, std::string> addresses_;
  const int slurmd_port_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> drains_;  // node, reason
  int draining_ = 0;
  bool stopping_ = false;
  std::thread drainer_;
};

}  // namespace trainguard
