// Agent: warm standby ranks (standby.h, docs/restart.md) — made after the
// node's first step of a generation, at low priority, one per local rank;
// taken by the next start, which says why a rank started cold otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "agent/agent.h"
#include "agent/agent_rank.h"

namespace trainguard {

namespace {

// How long a standby may take to answer the order to become the rank (it
// stats the files it imported, a few ms).
constexpr Nanos kActivationTimeout = 5 * kSecond;
// Added to a standby's niceness while it imports, when it can lower it back
// (root); otherwise it imports at the ranks' priority, after the first step.
constexpr int kStandbyNice = 10;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string Agent::ImportsFile(int local_rank) const {
  return config_.run_dir + "/standby/local" + std::to_string(local_rank) + ".imports";
}

void Agent::PrepareWarm(const v1::Start& start, bool instrument) {
  WarmState& w = *warm_;
  w.enabled = start.warm() && instrument;
  w.made.clear();
  w.env.clear();
  w.cmd.reset();
  w.not_warm.clear();
  if (!start.warm()) {
    DropStandbys();
    return;
  }
  if (!instrument) {
    w.not_warm = "the ranks run without instrumentation (--no-instrument)";
    return;
  }
  std::vector<std::string> argv(start.argv().begin(), start.argv().end());
  auto cmd = ParsePythonCommand(argv);
  if (cmd.ok()) {
    w.cmd = *cmd;
  } else {
    w.not_warm = cmd.status().message();
  }
  std::error_code ec;
  std::filesystem::create_directories(config_.run_dir + "/standby", ec);
}

std::optional<SpawnedProcess> Agent::StartWarm(int local_rank, const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& env,
                                               std::string* why) {
  WarmState& w = *warm_;
  auto it = w.standbys.find(local_rank);
  if (!w.cmd) {
    *why = w.not_warm;
  } else if (it == w.standbys.end()) {
    *why = generation_ == 0 ? "the first start has no standby" : "no standby was made (the rank made no step)";
  } else {
    auto proc = it->second->Activate(*w.cmd, argv, env, w.cwd, kActivationTimeout);
    if (proc.ok()) {
      w.standbys.erase(it);
      return *proc;
    }
    *why = "standby not used: " + proc.status().message();
  }
  if (it != w.standbys.end()) w.standbys.erase(it);
  return std::nullopt;
}

void Agent::MaybeMakeStandbys() {
  WarmState& w = *warm_;
  Nanos now = clock_->MonotonicNanos();
  Standby::ReapKilled();
  for (auto& [local, standby] : w.standbys) {
    Standby::State before = standby->state();
    standby->Poll();
    if (standby->state() == before) continue;
    if (standby->state() == Standby::State::kReady) {
      std::fprintf(stderr, "trainguard agent %s: warm standby of local rank %d ready in %.1f s (pid %d, %lld MiB)\n",
                   config_.node_id.c_str(), local, static_cast<double>(now - standby->launched_mono()) / kSecond,
                   standby->pid(), static_cast<long long>(standby->rss_kb() / 1024));
    } else {
      std::fprintf(stderr, "trainguard agent %s: warm standby of local rank %d gone: %s\n",
                   config_.node_id.c_str(), local, standby->reason().c_str());
    }
  }
  if (!w.enabled || !w.cmd) return;
  for (const auto& rank : ranks_) {
    if (!rank->running || w.made.count(rank->local_rank) || rank->page.get() == nullptr) continue;
    // After the first step only: a standby never competes with start-up.
    if (rank->page.get()->first_step_mono_ns.load(std::memory_order_relaxed) == 0) continue;
    std::string imports = ImportsFile(rank->local_rank);
    if (!Exists(imports)) continue;  // the rank writes it at its first step
    w.made.insert(rank->local_rank);
    auto env = w.env[rank->local_rank];
    env.erase("TRAINGUARD_STATUS_PAGE");
    env.erase("TRAINGUARD_STACKS_FILE");
    env.erase("TRAINGUARD_IMPORTS_FILE");
    auto standby = Standby::Launch(*w.cmd, std::move(env), w.cwd, imports,
                                   geteuid() == 0 ? kStandbyNice : 0, now);
    if (!standby.ok()) {
      std::fprintf(stderr, "trainguard agent %s: no warm standby for local rank %d: %s\n",
                   config_.node_id.c_str(), rank->local_rank, standby.status().ToString().c_str());
      continue;
    }
    w.standbys[rank->local_rank] = std::make_unique<Standby>(std::move(*standby));
    if (rank->local_rank == 0 && group_rank_ == 0) SendImports(imports);
  }
}

void Agent::SendImports(const std::string& imports) {
  std::ifstream f(imports);
  v1::AgentMessage m;
  m.mutable_standby_imports()->set_generation(generation_);
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty()) m.mutable_standby_imports()->add_modules(line);
  }
  Send(m);
}

void Agent::PrepareSpareStandbys(const v1::PrepareStandby& order) {
  if (!ranks_.empty()) return;  // not idle: its own ranks' standbys are made after their first step
  const v1::Start& start = order.start();
  PrepareWarm(start, !start.no_instrument());
  WarmState& w = *warm_;
  if (!w.enabled || !w.cmd) return;
  std::string modules;
  for (const auto& m : order.modules()) modules += m + "\n";
  const std::map<std::string, std::string> base = RanksEnvironment(start);
  Nanos now = clock_->MonotonicNanos();
  for (int local = 0; local < start.nproc_per_node(); ++local) {
    auto it = w.standbys.find(local);
    if (it != w.standbys.end() && it->second->state() != Standby::State::kGone &&
        it->second->target() == w.cmd->target()) {
      continue;  // the one it has serves
    }
    std::string imports = ImportsFile(local);
    std::string tmp = imports + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << modules;
      if (!out.flush()) continue;
    }
    if (rename(tmp.c_str(), imports.c_str()) != 0) continue;
    auto env = base;
    env["LOCAL_RANK"] = std::to_string(local);
    auto standby = Standby::Launch(*w.cmd, std::move(env), w.cwd, imports, geteuid() == 0 ? kStandbyNice : 0, now);
    if (!standby.ok()) {
      std::fprintf(stderr, "trainguard agent %s: no warm standby for local rank %d: %s\n",
                   config_.node_id.c_str(), local, standby.status().ToString().c_str());
      continue;
    }
    w.standbys[local] = std::make_unique<Standby>(std::move(*standby));
    w.made.insert(local);
  }
}

void Agent::DropStandbys() {
  if (warm_) warm_->standbys.clear();  // each one killed and reaped
}

}  // namespace trainguard
