// Agent: warm standby ranks (standby.h, docs/restart.md) — made after the
// node's first step of a generation, at low priority, one per local rank;
// taken by the next start, which says why a rank started cold otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "agent/agent.h"
#include "agent/agent_rank.h"
#include "common/status_page.h"

namespace trainguard {

namespace {

// How long a standby may take to answer the order to become the rank (it
// stats the files it imported, a few ms).
constexpr Nanos kActivationTimeout = 5 * kSecond;
// Added to a standby's niceness while it imports, when it can lower it back
// (root); otherwise it imports at the ranks' priority, after the first step.
constexpr int kStandbyNice = 10;
// A start awaits a standby still importing: it started before the start
// came, so it is ahead of a cold process. Given up on (the rank starts
// cold) when it shows no progress — no CPU time, no bytes read — for
// kStandbyStall (an import hung on a lock or a sleep), or at twice the
// rank's cold imports plus kStandbyMargin (kStandbyWaitUnknown where no
// cold start of the rank was measured here: a spare's standby).
constexpr Nanos kStandbyStall = 2 * kSecond;
constexpr Nanos kStandbyMargin = 2 * kSecond;
constexpr Nanos kStandbyWaitUnknown = 60 * kSecond;
constexpr Nanos kStandbySample = 100 * kMillisecond;

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

bool Agent::AwaitStandby(std::unique_ptr<Rank>& rank, SpawnSpec& spec, const std::string& log_base) {
  WarmState& w = *warm_;
  auto it = w.standbys.find(rank->local_rank);
  if (!w.cmd || it == w.standbys.end()) return false;
  it->second->Poll();
  if (it->second->state() != Standby::State::kImporting) return false;
  it->second->Hurry();
  const Nanos now = clock_->MonotonicNanos();
  auto cold = w.cold_imports.find(rank->local_rank);
  WarmState::Awaited a;
  a.until = now + (cold != w.cold_imports.end() ? 2 * cold->second + kStandbyMargin : kStandbyWaitUnknown);
  a.progress = ActivityTracker(now);
  a.next_sample = now;
  a.rank = std::move(rank);
  a.spec = std::move(spec);
  a.log_base = log_base;
  w.awaited.push_back(std::move(a));
  return true;
}

void Agent::AwaitStandbys() {
  WarmState& w = *warm_;
  if (w.awaited.empty()) return;
  const Nanos now = clock_->MonotonicNanos();
  for (auto a = w.awaited.begin(); a != w.awaited.end();) {
    Rank& rank = *a->rank;
    auto it = w.standbys.find(rank.local_rank);
    if (it != w.standbys.end() && it->second->state() == Standby::State::kImporting) {
      Standby& standby = *it->second;
      standby.Poll();
      if (standby.state() == Standby::State::kImporting && now >= a->next_sample) {
        a->progress.Update(SampleGroupActivity(standby.pid()), now);
        a->next_sample = now + kStandbySample;
      }
      if (standby.state() == Standby::State::kImporting) {
        char waited[32];
        std::snprintf(waited, sizeof(waited), "%.1f s", static_cast<double>(now - rank.launch_mono) / kSecond);
        if (now - a->progress.last_change() >= kStandbyStall) {
          standby.Abandon("the standby is still importing and made no progress for " +
                          std::to_string(kStandbyStall / kSecond) + " s (waited " + waited + ")");
        } else if (now >= a->until) {
          standby.Abandon(std::string("the standby is still importing after a wait of ") + waited +
                          ", twice this rank's cold imports");
        } else {
          ++a;
          continue;
        }
      }
    }
    std::unique_ptr<Rank> taken = std::move(a->rank);
    SpawnSpec spec = std::move(a->spec);
    const std::string log_base = std::move(a->log_base);
    a = w.awaited.erase(a);
    StatusOr<SpawnedProcess> proc = InvalidArgument("not started");
    if (auto warm = StartWarm(taken->local_rank, spec.argv, spec.env, &taken->cold_reason)) {
      proc = *warm;
      taken->warm = true;
    } else {
      proc = Spawn(spec);
    }
    taken->standby_wait = clock_->MonotonicNanos() - taken->launch_mono;
    std::fprintf(stderr, "trainguard agent %s: rank %d waited %.2f s for its warm standby's imports: %s\n",
                 config_.node_id.c_str(), taken->global_rank,
                 static_cast<double>(taken->standby_wait) / kSecond,
                 taken->warm ? "started warm" : ("started cold, " + taken->cold_reason).c_str());
    LaunchRank(std::move(taken), std::move(proc), log_base);
  }
  MaybeSendStarted();
}

void Agent::HurryStandbys() {
  for (auto& [local, standby] : warm_->standbys) standby->Hurry();
}

void Agent::LearnColdImports(const Rank& rank) {
  const StatusPage* page = rank.page.get();
  if (rank.warm || page == nullptr) return;
  // The imports end where the process group, a restore or the first step begins.
  Nanos end = page->first_step_mono_ns.load(std::memory_order_relaxed);
  for (int mark : {kMarkPgInitBegin, kMarkRestoreBegin}) {
    const Nanos at = page->startup_mono_ns[mark].load(std::memory_order_relaxed);
    if (at > 0 && (end == 0 || at < end)) end = at;
  }
  if (end <= rank.launch_mono) return;
  warm_->cold_imports[rank.local_rank] = end - rank.launch_mono - std::max<Nanos>(rank.standby_wait, 0);
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
    LearnColdImports(*rank);
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
