// The `trainguard` subcommands. main.cc parses flags into these option
// structs and calls one function; each returns the process exit code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainguard {

struct JobOptions {
  int nnodes = 1;
  int nproc_per_node = 1;
  int max_restarts = 3;
  double hang_timeout_s = 300;
  double startup_timeout_s = 600;
  double heartbeat_interval_s = 1;
  int missed_heartbeats = 5;
  double stop_grace_s = 5;
  double stop_timeout_s = 30;
  double rendezvous_timeout_s = 300;
  std::string store = "trainguard.db";
  std::string job_id;       // "" = generated
  std::string run_dir;      // "" = /tmp/trainguard/<job_id>
  bool native_stacks = false;
  int no_progress_restarts = 3;
  std::vector<std::string> extra_rules;  // attribution rules merged over the shipped ones
  std::vector<std::string> command;
};

struct ControllerOptions {
  JobOptions job;
  std::string listen = "0.0.0.0:29400";
};

struct AgentOptions {
  std::string controller;   // HOST:PORT
  std::string node_id;      // "" = hostname
  std::string address;      // "" = derived from the controller address
  std::string run_dir;      // "" = <run_dir_base>/<node_id>
  std::string run_dir_base = "/tmp/trainguard";
  int group_rank = -1;      // preferred group rank, -1 = any
  double connect_timeout_s = 10;
  bool native_stacks = false;
  bool quiet = false;
  unsigned protocol_version = 0;  // 0 = ours; tests set another to check refusal
};

struct EventsOptions {
  std::string store = "trainguard.db";
  std::string job_id;       // "" = the newest job
  bool json = false;
};

struct CkptOptions {
  std::string dir;
  std::int64_t step = -1;   // verify: -1 = every step
  bool json = false;
};

struct AttributeOptions {
  std::vector<std::string> files;        // one rank's log each ("-" = stdin)
  std::vector<std::string> extra_rules;  // merged over the shipped rules
  bool json = false;
};

int RunJob(const JobOptions& options);
int AttributeCommand(const AttributeOptions& options);
int ListCheckpointsCommand(const CkptOptions& options);
int VerifyCheckpointsCommand(const CkptOptions& options);
int RunController(const ControllerOptions& options);
int RunAgent(const AgentOptions& options);
int ShowEvents(const EventsOptions& options);
// trainguard report: incidents with attribution, and the downtime accounting.
int ShowReport(const EventsOptions& options);

// Checks a job's options and command; "" if fine, else a one-line error.
std::string ValidateJob(const JobOptions& options);

}  // namespace trainguard
