// Supervise and what it takes: the part of `run` and `controller` that
// runs a job's controller and the agents beside it. Private to src/cli.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/slurm.h"
#include "controller/job_config.h"
#include "store/event_store.h"

namespace trainguard {

// An agent this process starts next to its controller.
struct LocalNode {
  std::string node_id;
  int group_rank = -1;     // -1: from a "node<N>" id, else any
  std::string address;     // what peers reach it at
};

// Supervise's answer when the endpoint it was to serve is served already
// (another host of the job bound it first): nothing was recorded.
constexpr int kEndpointTaken = -1;

// The nodes of a Slurm allocation (`run --scheduler slurm`): every one of
// them gets an agent, the first --nnodes hold the job, the rest are spares.
struct SlurmSetup {
  std::map<std::string, SlurmNodeInfo> nodes;  // by name
  std::string controller_host;                 // this node's address
  int slurmd_port = 0;                         // where every slurmd listens (0: unknown)
};

// The knobs as their flags set them (controller/job_knobs.h), and the job.
// How often the controller daemon calls JobController::Tick.
constexpr Nanos kTickInterval = 50 * kMillisecond;
// A `controller`'s lead of its job on PostgreSQL lasts this long unrenewed
// (renewed every third of it); a standby takes over once it expired
// (docs/standby.md).
constexpr Nanos kLeadTtl = 6 * kSecond;
// The exit status of a controller that stepped down (another one leads)
// and could not stand by again.
constexpr int kSteppedDown = 3;

// This process's command line, for a controller that stepped down to stand
// by again as the same command (main calls it first).
void RememberCommandLine(int argc, char** argv);

JobConfig MakeConfig(const JobOptions& o, const std::string& job_id);

// Whether `id` is cordoned in the store; if so, says that the job does not
// use it, who cordoned it and how to return it.
bool SkipIfCordoned(EventStore* store, const std::string& id);

// Runs a controller on `listen` until the job finishes, and `local_nodes`'
// agents next to it. With `endpoint_may_be_taken`, a listen address in use
// returns kEndpointTaken before anything is written to the store.
int Supervise(const JobOptions& o, const std::string& listen, std::vector<LocalNode> local_nodes,
              bool endpoint_may_be_taken, bool pick_local_nodes = false, const SlurmSetup* slurm = nullptr);

// The agents `run` starts on this machine: node<i> for the lowest i whose
// node is not cordoned, nnodes of them with group ranks 0.. and then the
// spares; and, without spares, where a new node comes from when one is
// evicted (the next such id).
std::vector<LocalNode> PickLocalNodes(EventStore* store, int nnodes, int spares);

}  // namespace trainguard
