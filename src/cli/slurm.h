// What trainguard asks of Slurm, through its own commands (scontrol): the
// nodes of the allocation it runs in, a node's address and state, and
// draining a node with a reason. Parsing is kept apart (pure, tested on
// Slurm's own output) from running the commands. docs/slurm.md.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "trainguard/status.h"

namespace trainguard {

// One node as `scontrol show node NAME -o` prints it.
struct SlurmNodeInfo {
  std::string name;
  std::string address;  // NodeAddr
  std::string state;    // e.g. "IDLE", "ALLOCATED+DRAIN", "DOWN+NOT_RESPONDING"
  std::string reason;   // without Slurm's " [user@time]" suffix; "" if none
  // DOWN, FAIL or NOT_RESPONDING: Slurm's own word that the node failed.
  bool Failed() const;
};

// Parses one line of `scontrol show node -o`; an empty name if it holds none.
SlurmNodeInfo ParseScontrolNode(const std::string& line);

// SlurmdPort from `scontrol show config` ("SlurmdPort              = 6818");
// 6818, Slurm's default, when the output does not say.
int ParseSlurmdPort(const std::string& show_config);

// `text` as a Slurm reason: one line, at most 250 bytes (Slurm keeps reasons short).
std::string SlurmReason(const std::string& text);

// The reason trainguard gives Slurm when it drains a node: one line that
// names the job and says why ("trainguard job J incident 3: gpu_hardware on
// rank 2 on sn3: ..."), at most 250 bytes (Slurm keeps reasons short).
std::string DrainReason(const std::string& job_id, const std::string& why);

// The allocation `run --scheduler slurm` runs in, from the environment
// sbatch/salloc give the batch script.
struct SlurmAllocation {
  std::string job_id;      // SLURM_JOB_ID
  std::string nodelist;    // SLURM_JOB_NODELIST, compressed ("sn[1-5]")
  std::string this_node;   // SLURMD_NODENAME: where the controller runs
};
// Errors say what is missing ("not inside a Slurm allocation: ...").
StatusOr<SlurmAllocation> SlurmAllocationFromEnv(const std::function<const char*(const char*)>& getenv);

// Slurm's commands. Each is bounded in time; errors carry Slurm's words.
class Slurm {
 public:
  // `scontrol show hostnames LIST`: the node names, in order.
  static StatusOr<std::vector<std::string>> Hostnames(const std::string& nodelist);
  static StatusOr<SlurmNodeInfo> Node(const std::string& name, Nanos timeout = 20 * kSecond);
  // `scontrol update NodeName=N State=DRAIN Reason=R`. Needs Slurm's operator
  // rights: a refusal says so (docs/slurm.md).
  static Status Drain(const std::string& name, const std::string& reason);
  // The port every slurmd listens on (`scontrol show config`).
  static StatusOr<int> SlurmdPort();
};

}  // namespace trainguard
