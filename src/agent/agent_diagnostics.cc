// Agent: the diagnostics the controller orders, run on a thread of their own.
#include "agent/agent.h"
#include "agent/agent_rank.h"
#include "agent/timing_collector.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <thread>

#include "agent/error_file.h"
#include "agent/journal_status.h"
#include "agent/link_stats.h"
#include "agent/output_pump.h"
#include "agent/process.h"
#include "common/status_page.h"
#include "diag/collective_probe.h"
#include "diag/suite.h"
#include "proto/sanitize.h"

namespace trainguard {

namespace fs = std::filesystem;

struct Agent::DiagnosticsRun {
  std::int64_t round = 0;
  bool collective = false;
  Nanos started_mono = 0;
  std::atomic<bool> done{false};
  std::vector<Figure> figures;  // written before done is set
};

void Agent::StartDiagnostics(const v1::RunDiagnostics& order) {
  if (diagnostics_ != nullptr) return;  // one round at a time; the controller waits for it
  auto run = std::make_shared<DiagnosticsRun>();
  run->round = order.round();
  run->collective = order.collective();
  run->started_mono = clock_->MonotonicNanos();
  diagnostics_ = run;
  if (order.collective()) {
    CollectivePlan plan;
    plan.python = !order.python().empty() ? order.python()
                  : std::getenv("TRAINGUARD_PYTHON") != nullptr ? std::getenv("TRAINGUARD_PYTHON")
                                                                 : "python3";
    plan.script = config_.python_dir.empty() ? "" : config_.python_dir + "/trainguard/_collective_probe.py";
    plan.work_dir = config_.run_dir;
    plan.local_ranks = order.local_ranks();
    plan.gpu = order.gpu();
    plan.nccl = order.nccl();
    plan.rack_rank = order.rack_rank();
    plan.rack_size = order.rack_size();
    plan.rack_master = order.rack_master();
    if (order.mode() == "full") {
      plan.bytes = 64ll << 20;
      plan.iters = 20;
    }
    std::thread([run, plan] {
      run->figures = RunCollectiveProbe(plan);
      run->done.store(true);
    }).detach();
    return;
  }
  SuitePlan plan;
  plan.mode = order.mode() == "full" ? "full" : "quick";
  for (const auto& p : order.paths()) {
    auto eq = p.find('=');
    if (eq != std::string::npos && eq > 0) plan.paths.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  if (plan.paths.empty()) plan.paths.emplace_back("scratch", config_.run_dir);
  plan.peers.assign(order.peers().begin(), order.peers().end());
  // Detached: a probe stuck in the kernel (a dead file system) must not
  // hold up the agent's exit; the controller times the round out.
  std::thread([run, plan] {
    run->figures = RunSuite(plan);
    run->done.store(true);
  }).detach();
}

void Agent::MaybeSendDiagnostics() {
  if (diagnostics_ == nullptr || !diagnostics_->done.load()) return;
  v1::AgentMessage m;
  v1::DiagnosticsResult* result = m.mutable_diagnostics();
  result->set_round(diagnostics_->round);
  result->set_figures_json(FiguresToJson(diagnostics_->figures));
  result->set_wall_ms((clock_->MonotonicNanos() - diagnostics_->started_mono) / kMillisecond);
  result->set_collective(diagnostics_->collective);
  if (diagnostics_->collective) result->set_free_port(FindFreePort());  // its old one may have served the rack
  diagnostics_.reset();
  Send(m);
}

}  // namespace trainguard
