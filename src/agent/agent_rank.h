// Agent::Rank: one rank process of the running generation, as the agent
// holds it. Private to src/agent (agent.cc, agent_ranks.cc, agent_stop.cc).
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "agent/agent.h"
#include "agent/output_pump.h"
#include "agent/process.h"
#include "agent/standby.h"
#include "agent/storage_io.h"
#include "agent/timing_collector.h"
#include "common/status_page.h"

namespace trainguard {

// Written by the Python module's init() at the top of the stacks file once
// faulthandler is registered for SIGUSR1; without it SIGUSR1 would kill the rank.
constexpr const char* kStacksReadyMarker = "trainguard-stacks-ready";

struct Agent::Rank {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  Nanos launch_mono = 0;
  MappedStatusPage page;
  std::string stacks_path;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  std::unique_ptr<OutputPump> output;
  std::set<int> pids;      // the rank and every process seen in its group
  bool running = false;
  ExitInfo exit;
  ActivityTracker activity{0};
  GroupActivity last_sample;                  // the group's counters at the last heartbeat
  BlockedTracker blocked;                     // its tasks blocked in file I/O ...
  std::vector<BlockedTracker::Blocked> blocked_now;  // ... at the last heartbeat
  std::uint64_t rchar_seen = 0;  // the group's rchar at the last heartbeat
  Nanos read_changed = -1;       // when it last grew; -1 before the second sample
  TimingCollector timings;  // this rank's per-step timings, from its page
  bool warm = false;        // a standby became it
  std::string cold_reason;  // why not, where warm starts are on
  Nanos standby_wait = -1;  // how long its start waited for its standby's imports; -1: no wait
  mutable std::int64_t fingerprints_sent_step = -1;  // the newest fingerprint step reported
  std::string save_ledger;                 // TRAINGUARD_SAVE_LEDGER: torch.save directories, a line each
  mutable std::uintmax_t save_ledger_read = 0;  // bytes of it already reported
};

// What the agent needs to make the next start's warm standbys, from the
// last Start (agent_standby.cc).
struct Agent::WarmState {
  bool enabled = false;
  std::optional<PythonCommand> cmd;  // the ranks' command, if it can run warm
  std::string not_warm;              // why it cannot
  std::string cwd;
  std::map<int, std::map<std::string, std::string>> env;  // by local rank: its last start's
  std::map<int, std::unique_ptr<Standby>> standbys;       // by local rank
  std::set<int> made;                                     // local ranks with a standby made this generation
  // By local rank: how long its last cold start took from its launch to
  // the end of its imports (process group, restore or first step begins).
  std::map<int, Nanos> cold_imports;
  // Ranks of the start whose standby was still importing: awaited (it is
  // ahead of a cold process) until it is ready, gone, or makes no progress.
  struct Awaited {
    std::unique_ptr<Rank> rank;
    SpawnSpec spec;
    std::string log_base;
    Nanos until = 0;          // the most it is waited for (monotonic)
    ActivityTracker progress{0};
    Nanos next_sample = 0;
  };
  std::vector<Awaited> awaited;
};

}  // namespace trainguard
