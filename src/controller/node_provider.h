// NodeProvider: the scheduler backend as the controller sees it (local
// processes, Slurm, the simulator): what is done about a lost or evicted
// node, and what the backend knows of why it was lost.
#pragma once

#include <optional>
#include <string>

#include "controller/finding.h"

namespace trainguard {

// What a scheduler backend knows of a lost node: one sentence for people
// ("the agent of node X exited ... while its host stayed up", "Slurm
// reports node X DOWN"), and the verdict it supports — from the backend's
// structured knowledge (an exit status, Slurm's node state), never from the
// sentence. Empty when nothing is known.
struct LossExplanation {
  std::string sentence;
  std::optional<DetectorVerdict> verdict;
};

// The verdicts of the backends: the host is down or cut off (node_failure,
// hardware, persistent: evict the node) and the agent process ended while its
// host stayed up (other, software, transient: restart; no suspicion on the
// node).
DetectorVerdict HostDownVerdict(const std::string& node_id);
DetectorVerdict AgentExitedVerdict();

// Scheduler backend: what is done about a node that was lost.
class NodeProvider {
 public:
  virtual ~NodeProvider() = default;
  // `node_id` was lost: kills what is left of it and brings a replacement
  // that will register, under the same or another node id. Must not block.
  virtual void ReplaceNode(const std::string& node_id, const std::string& reason) = 0;
  // `node_id` is bad and cordoned: kills what is left of it, for good. A
  // backend may bring a new node under another id (the cordoned one would be
  // refused). Must not block. Returns whether a node is on its way to take
  // the evicted one's place. By default, what ReplaceNode does (true).
  virtual bool EvictNode(const std::string& node_id, const std::string& reason) {
    ReplaceNode(node_id, reason);
    return true;
  }
  // What the backend knows of why the node's agent went away (nothing by
  // default). Called before ReplaceNode, off the controller's lock, on a
  // thread of its OffLockRunner (off_lock_runner.h): it may take seconds
  // (ask the scheduler), but must be bounded.
  virtual LossExplanation ExplainLoss(const std::string& node_id) {
    (void)node_id;
    return {};
  }
};

}  // namespace trainguard
