// `trainguard diag`: runs the node diagnostics suite here, records the
// figures with the node in the store, and judges them against floors and
// against the newest figures of the other nodes; `--show` judges what the
// store holds without measuring.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/cli_support.h"
#include "cli/commands.h"
#include "cli/slurm.h"
#include "common/clock.h"
#include "common/json_text.h"
#include "diag/collective_probe.h"
#include "diag/judge.h"
#include "diag/suite.h"
#include "store/event_store.h"
#include "store/node_cordon.h"

namespace trainguard {

using nlohmann::json;

namespace {

// Drains `node` in Slurm with `reason`; 1 either way (the prolog fails, and
// Slurm drains the node itself should our drain have been refused).
int DrainInSlurm(const std::string& node, const std::string& reason) {
  const std::string text = SlurmReason(reason);
  Status drained = Slurm::Drain(node, text);
  if (drained.ok()) {
    std::fprintf(stderr, "trainguard: node %s drained in Slurm: %s\n", node.c_str(), text.c_str());
  } else {
    std::fprintf(stderr, "trainguard: error: %s\n", drained.message().c_str());
  }
  return 1;
}

const char* const kKinds[] = {"compute_gflops", "memory_gbps", "disk_write_mbps", "disk_read_mbps",
                              "disk_free_gib",  "net_tx_mbps", "net_rx_mbps"};

bool KnownKind(const std::string& kind) {
  for (const char* k : kKinds) {
    if (kind == k) return true;
  }
  return false;
}

// "KIND=NUMBER" into `into`; "" if fine, else the error.
std::string ParseKindValue(const std::string& flag, const std::string& text, std::map<std::string, double>* into) {
  auto eq = text.find('=');
  if (eq == std::string::npos) return flag + " '" + text + "' is not KIND=NUMBER";
  std::string kind = text.substr(0, eq), number = text.substr(eq + 1);
  if (!KnownKind(kind)) {
    std::string known;
    for (const char* k : kKinds) known += std::string(known.empty() ? "" : ", ") + k;
    return flag + " names an unknown figure '" + kind + "' (known: " + known + ")";
  }
  char* end = nullptr;
  double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(v >= 0)) {
    return flag + " '" + text + "': '" + number + "' is not a non-negative number";
  }
  (*into)[kind] = v;
  return "";
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : v >= 1 ? "%.2f" : "%.3f", v);
  return buf;
}

json VerdictJson(const NodeVerdict& v, const DiagnosticsRecord& record) {
  json figures = json::array();
  for (const auto& f : v.figures) {
    json j = {{"name", f.figure.name}, {"value", f.figure.value}, {"ok", f.failure.empty()}};
    if (!f.figure.error.empty()) j["error"] = f.figure.error;
    if (!f.figure.device.empty()) j["device"] = f.figure.device;
    if (f.peers > 0) {
      j["median"] = f.median;
      j["nodes_in_median"] = f.peers;
    }
    if (!f.failure.empty()) j["failure"] = f.failure;
    figures.push_back(std::move(j));
  }
  return {{"node", v.node},      {"healthy", v.healthy},         {"mode", record.mode},
          {"job_id", record.job_id}, {"unix_ms", record.wall_ns / kMillisecond},
          {"figures", figures},  {"failures", v.failures}};
}

void PrintVerdict(const NodeVerdict& v, const DiagnosticsRecord& record) {
  std::printf("node %s (%s suite): %s\n", v.node.c_str(), record.mode.c_str(), v.healthy ? "ok" : "FAIL");
  for (const auto& f : v.figures) {
    std::string value = f.figure.error.empty() ? Number(f.figure.value) : "-";
    std::string median = f.peers > 0 ? "median " + Number(f.median) + " of " + std::to_string(f.peers) : "";
    std::printf("  %-28s %10s  %-18s %s\n", f.figure.name.c_str(), value.c_str(), median.c_str(),
                f.failure.empty() ? "ok" : ("FAIL: " + f.failure).c_str());
  }
}

// The suite, then (when the driver lists GPUs) each GPU's GEMM and host
// copies with the job's PyTorch: the figures a diagnosis round's collective
// stage measures, here without a job.
std::vector<Figure> MeasureNode(const SuitePlan& plan, const DiagOptions& o, const std::string& work_dir) {
  std::vector<Figure> figures = RunSuite(plan);
  bool gpus = false;
  for (const Figure& f : figures) gpus |= f.name == "gpu_count" && f.error.empty() && f.value > 0;
  if (!gpus || !o.gpu_compute) return figures;
  CollectivePlan gpu;
  const char* env = std::getenv("TRAINGUARD_PYTHON");
  gpu.python = !o.python.empty() ? o.python : env != nullptr && *env != '\0' ? env : "python3";
  const std::string dir = PythonDir();
  if (dir.empty()) {
    figures.push_back({"collective_probe", 0, "the trainguard Python package is not next to this binary: no GPU "
                                              "compute or copy figures"});
    return figures;
  }
  gpu.script = dir + "/trainguard/_collective_probe.py";
  gpu.work_dir = work_dir;
  gpu.gpu = true;
  if (plan.mode == "full") {
    gpu.bytes = 64ll << 20;
    gpu.iters = 20;
  }
  for (Figure& f : RunCollectiveProbe(gpu)) figures.push_back(std::move(f));
  return figures;
}

}  // namespace

int DiagCommand(const DiagOptions& o) {
  JudgePolicy policy;
  for (const auto& f : o.floors) {
    if (auto err = ParseKindValue("--floor", f, &policy.floors); !err.empty()) {
      std::fprintf(stderr, "trainguard: error: %s\n", err.c_str());
      return 2;
    }
  }
  for (const auto& f : o.fractions) {
    if (auto err = ParseKindValue("--fraction", f, &policy.fraction_of_median); !err.empty()) {
      std::fprintf(stderr, "trainguard: error: %s\n", err.c_str());
      return 2;
    }
  }
  SuitePlan plan;
  plan.mode = o.full ? "full" : "quick";
  static const std::regex kRole("[A-Za-z0-9_.-]+");
  for (const auto& p : o.paths) {
    auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == p.size() || !std::regex_match(p.substr(0, eq), kRole)) {
      std::fprintf(stderr, "trainguard: error: --path '%s' is not ROLE=DIR (e.g. checkpoint=/ckpt)\n", p.c_str());
      return 2;
    }
    plan.paths.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  if (plan.paths.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    plan.paths.emplace_back("scratch", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  }

  std::unique_ptr<EventStore> store;
  if (!o.store.empty()) {
    if (o.show && !IsPostgresUrl(o.store) && !std::filesystem::exists(o.store)) {
      std::fprintf(stderr, "trainguard: error: no store at %s (use --store PATH)\n", StoreDisplayName(o.store).c_str());
      return 2;
    }
    auto opened = OpenEventStore(o.store);
    if (!opened.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", opened.status().message().c_str());
      return 2;
    }
    store = std::move(opened.value());
  } else if (o.show) {
    std::fprintf(stderr, "trainguard: error: --show reads the store; --no-store leaves nothing to show\n");
    return 2;
  }

  const char* slurm_node = std::getenv("SLURMD_NODENAME");
  const std::string node = !o.node_id.empty()                              ? o.node_id
                           : o.slurm_drain && slurm_node != nullptr && *slurm_node ? std::string(slurm_node)
                                                                                   : Hostname();
  // As a Slurm prolog: a node cordoned in the store (by an operator, or
  // evicted by any job) is drained in Slurm too, before a job lands on it.
  if (o.slurm_drain && store) {
    auto health = store->GetNodeHealth(node);
    if (health.ok() && health->status == "cordoned") {
      return DrainInSlurm(node, "trainguard: cordoned: " + health->reason);
    }
  }

  // The newest record of every other node (every node with --show), within --max-age.
  std::vector<NodeFigures> nodes;
  std::vector<DiagnosticsRecord> judged;
  int stale = 0;
  if (store) {
    auto latest = store->LatestDiagnostics();
    if (!latest.ok()) {
      std::fprintf(stderr, "trainguard: error: %s\n", latest.status().message().c_str());
      return 2;
    }
    const Nanos oldest = WallNowNanos() - static_cast<Nanos>(o.max_age_s * kSecond);
    for (auto& r : *latest) {
      if (r.node == node && !o.show) continue;  // ours is measured now
      if (r.wall_ns < oldest) {
        ++stale;
        continue;
      }
      auto figures = FiguresFromJson(r.figures_json);
      if (!figures.ok()) {
        std::fprintf(stderr, "trainguard: warning: node %s's diagnostics are unreadable: %s\n", r.node.c_str(),
                     figures.status().message().c_str());
        continue;
      }
      nodes.push_back({r.node, std::move(figures.value())});
      judged.push_back(std::move(r));
    }
  }
  if (!o.show) {
    if (!o.json) std::fprintf(stderr, "trainguard: running the %s diagnostics suite on node %s\n", plan.mode.c_str(), node.c_str());
    nodes.push_back({node, MeasureNode(plan, o, plan.paths.front().second)});
    // Only speeds fail (below a floor or the median): a busy host may have
    // lowered them; the better of two runs counts (as in the controller's rounds).
    if (WorthMeasuringAgain(JudgeNodes(nodes, policy).back())) {
      if (!o.json) std::fprintf(stderr, "trainguard: node %s measured a speed below its floor or the nodes' median: measuring again\n", node.c_str());
      nodes.back().figures = BestOf(nodes.back().figures, MeasureNode(plan, o, plan.paths.front().second));
    }
    judged.push_back({node, WallNowNanos(), plan.mode, "", FiguresToJson(nodes.back().figures)});
    if (store) {
      if (Status s = store->RecordDiagnostics(judged.back()); !s.ok()) {
        std::fprintf(stderr, "trainguard: error: %s\n", s.message().c_str());
        return 2;
      }
    }
  }
  auto verdicts = JudgeNodes(nodes, policy);

  int failing = 0;
  json out = {{"nodes", json::array()}};
  for (std::size_t i = 0; i < verdicts.size(); ++i) {
    const bool shown = o.show || verdicts[i].node == node;
    if (!shown) continue;
    failing += !verdicts[i].healthy;
    if (o.json) {
      out["nodes"].push_back(VerdictJson(verdicts[i], judged[i]));
    } else {
      PrintVerdict(verdicts[i], judged[i]);
    }
  }
  if (o.json) {
    out["nodes_compared"] = verdicts.size();
    out["stale_records_ignored"] = stale;
    out["policy"] = {{"floors", policy.floors},
                     {"fraction_of_median", policy.fraction_of_median},
                     {"min_nodes_for_median", policy.min_nodes_for_median},
                     {"gpu_model_floors", policy.gpu_model_floors},
                     {"fraction_of_node_gpus", policy.fraction_of_node_gpus}};
    std::cout << out.dump(2, ' ', false, kReplaceBadUtf8) << "\n";
  } else {
    if (o.show && verdicts.empty()) std::printf("no node has diagnostics in %s\n", StoreDisplayName(o.store).c_str());
    std::printf("judged against %zu node(s)' newest diagnostics%s; a figure fails below its floor or, with %zu or "
                "more nodes, below its fraction of their median\n",
                verdicts.size(), stale > 0 ? (" (" + std::to_string(stale) + " older than --max-age ignored)").c_str() : "",
                policy.min_nodes_for_median);
    if (o.show && failing > 0) {
      std::printf("failing:");
      for (const auto& v : verdicts) {
        if (!v.healthy) std::printf(" %s", v.node.c_str());
      }
      std::printf("\n");
    }
  }
  if (failing > 0 && o.slurm_drain && !o.show) {
    std::string why;
    for (const auto& v : verdicts) {
      if (v.node != node) continue;
      for (const auto& f : v.failures) why += (why.empty() ? "" : "; ") + f;
    }
    if (store) {
      auto cordoned = CordonNodeInStore(store.get(), node, "trainguard diag --slurm-drain",
                                        "diagnostics failed: " + why, WallNowNanos());
      if (!cordoned.ok()) std::fprintf(stderr, "trainguard: warning: %s\n", cordoned.status().message().c_str());
    }
    DrainInSlurm(node, "trainguard diag: " + why);
  }
  return failing > 0 ? 1 : 0;
}

}  // namespace trainguard
