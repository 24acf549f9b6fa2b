#include "controller/node_provider.h"

namespace trainguard {

DetectorVerdict HostDownVerdict(const std::string& node_id) {
  DetectorVerdict v;
  v.rule_id = "slurm-node-down";
  v.category = "node_failure";
  v.description = "Slurm reports the node down, failed or not responding, or the node's slurmd does not answer: "
                  "its host is down or cut off";
  v.evict_nodes = {node_id};
  return v;
}

DetectorVerdict AgentExitedVerdict() {
  DetectorVerdict v;
  v.rule_id = "agent-exited";
  v.category = "other";
  v.hardware = false;
  v.persistence = "transient";
  v.description = "trainguard's agent process ended while its host stayed up: a fault of the agent process, not of "
                  "the node";
  return v;
}

}  // namespace trainguard
