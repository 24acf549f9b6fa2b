// trainguard plan: the settings to launch a job with, from the simulator
// (docs/checkpoint_policy.md). From the defaults, each knob in turn — how the
// job checkpoints, its spares, its hang timeout, what a straggler gets — is
// simulated at a few values (the same failures for every candidate: one
// seed) and the best kept, by goodput (ETTR less the time slow nodes cost
// and the work redone after corruption); the table says what each gave.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "cli/commands.h"
#include "cli/sim_support.h"
#include "controller/checkpoint_planner.h"
#include "sim/sim_output.h"
#include "sim/simulator.h"

namespace trainguard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Candidate {
  std::string knob;     // "defaults", "checkpoints", "spares", "hang timeout"
  std::string setting;  // what it sets, as the flags say it
  SimParams params;
  SimResult result;
  bool kept = false;    // the best of its knob, carried on
};

std::string Percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %%", 100 * v);
  return buf;
}

}  // namespace

int PlanCommand(const SimCommandOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "trainguard plan: error: %s\n", s.message().c_str());
    return 2;
  };
  auto model = ResolveFailureModel(o.model);
  if (!model.ok()) return fail(model.status());
  SimParams base;
  base.days = 7;  // each candidate's run; --days sets it
  if (Status s = MergeSimFlags(o, *model, &base); !s.ok()) return fail(s);
  if (Status s = base.Validate(); !s.ok()) return fail(InvalidArgument("parameter " + s.message()));
  auto rules = LoadRulesFor({});
  if (!rules.ok()) return fail(rules.status());

  const int nodes = base.gpus / base.gpus_per_node;
  const double mtbf_s = 86400 / (model->PerNodeDay() * nodes);
  const double daly = std::max({OptimalCheckpointInterval(base.checkpoint_blocked_s, mtbf_s), base.persist_s,
                                base.step_s});
  std::vector<Candidate> all;
  int run = 0;
  auto simulate = [&](Candidate c) -> StatusOr<Candidate> {
    TemporarySimStore store(run++);
    SimOptions opt;
    opt.rules = &*rules;
    opt.store_path = store.path();
    std::fprintf(stderr, "trainguard plan: %s: %s ...\n", c.knob.c_str(), c.setting.c_str());
    auto r = RunSimulation(c.params, *model, opt);
    if (!r.ok()) return r.status();
    c.result = std::move(r.value());
    return c;
  };
  // Each knob's candidates against the best so far: one that beats it is kept.
  Candidate best;
  auto try_knob = [&](std::vector<Candidate> cs) -> Status {
    int winner = -1;
    double goodput = best.result.ettr_true;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      auto done = simulate(cs[i]);
      if (!done.ok()) return done.status();
      cs[i] = std::move(done.value());
      if (cs[i].result.ettr_true > goodput) {
        goodput = cs[i].result.ettr_true;
        winner = static_cast<int>(i);
      }
    }
    if (winner >= 0) {
      cs[winner].kept = true;
      best = cs[winner];
    }
    for (auto& c : cs) all.push_back(std::move(c));
    return Status::Ok();
  };

  {
    auto done = simulate({"defaults", "checkpoints every " + std::to_string(static_cast<int>(base.checkpoint_interval_s)) +
                                          " s to storage, spares " + std::to_string(base.spares) + ", hang timeout " +
                                          std::to_string(static_cast<int>(base.hang_timeout_s)) + " s",
                          base, {}, true});
    if (!done.ok()) return fail(done.status());
    best = done.value();
    all.push_back(best);
  }
  // How the job checkpoints: the controller's plan over both tiers, or one
  // storage interval at Daly's optimum for the model's MTBF.
  SimParams p = best.params;
  p.checkpoint_policy = "auto";
  std::vector<Candidate> cs = {{"checkpoints", "auto: memory and storage tiers on the controller's plan", p, {}}};
  p = best.params;
  p.checkpoint_interval_s = daly;
  cs.push_back({"checkpoints", "every " + std::to_string(static_cast<int>(std::lround(daly))) +
                                   " s to storage (Daly's optimum for the model's MTBF of " +
                                   std::to_string(static_cast<int>(std::lround(mtbf_s / 60))) + " min)",
                p, {}});
  if (Status s = try_knob(cs); !s.ok()) return fail(s);
  // Spares: a few replace evicted nodes at once instead of waiting for the scheduler.
  cs.clear();
  for (int spares : {std::max(2, nodes / 1000), std::max(8, nodes / 250)}) {
    if (spares <= best.params.spares) continue;
    p = best.params;
    p.spares = spares;
    cs.push_back({"spares", std::to_string(spares) + " hot spare node(s)", p, {}});
  }
  if (Status s = try_knob(cs); !s.ok()) return fail(s);
  // The hang timeout: a hang costs its timeout in detection.
  cs.clear();
  for (double t : {120.0, 60.0}) {
    if (t >= best.params.hang_timeout_s || t <= 2 * best.params.step_s) continue;
    p = best.params;
    p.hang_timeout_s = t;
    cs.push_back({"hang timeout", std::to_string(static_cast<int>(t)) + " s", p, {}});
  }
  if (Status s = try_knob(cs); !s.ok()) return fail(s);
  // Stragglers: replacing a slow node costs a restart; keeping it, the job's pace while it lasts.
  if (model->stragglers.enabled() && best.params.straggler_action != "evict") {
    p = best.params;
    p.straggler_action = "evict";
    if (Status s = try_knob({{"stragglers", "evict (replace a node named slow)", p, {}}}); !s.ok()) return fail(s);
  }

  const Candidate& first = all.front();
  const Candidate& chosen = best;
  char head[256];
  std::snprintf(head, sizeof(head), "%d GPUs (%d nodes x %d), failure model %s, %g simulated days per candidate (seed %llu)",
                base.gpus, nodes, base.gpus_per_node, model->name.c_str(), base.days,
                static_cast<unsigned long long>(base.seed));
  std::string recommended = "--checkpoint-policy " + chosen.params.checkpoint_policy;
  if (chosen.params.checkpoint_policy == "fixed") {
    recommended += " (save every " + std::to_string(static_cast<int>(std::lround(chosen.params.checkpoint_interval_s))) + " s)";
  } else {
    recommended += " (trainguard.Checkpointer(save_every=\"auto\"))";
  }
  recommended += " --spares " + std::to_string(chosen.params.spares) + " --hang-timeout " +
                 std::to_string(static_cast<int>(chosen.params.hang_timeout_s)) + " --straggler-action " +
                 chosen.params.straggler_action;
  if (o.json) {
    json rows = json::array();
    for (const auto& c : all) {
      rows.push_back({{"knob", c.knob}, {"setting", c.setting}, {"kept", c.kept}, {"ettr", c.result.report.ettr},
                      {"goodput", c.result.ettr_true}, {"sim", SimJson(c.params, *model, c.result)}});
    }
    std::printf("%s\n", json{{"candidates", rows}, {"recommended", recommended},
                             {"ettr", chosen.result.report.ettr}, {"defaults_ettr", first.result.report.ettr},
                             {"goodput", chosen.result.ettr_true}, {"defaults_goodput", first.result.ettr_true}}
                            .dump(2)
                            .c_str());
  } else {
    std::printf("trainguard plan: %s\n\n", head);
    std::printf("  %-14s %-78s %8s %8s %9s\n", "knob", "setting", "ETTR", "goodput", "vs dflt");
    for (const auto& c : all) {
      std::printf("%s %-14s %-78s %8s %8s %+8.1f\n", c.kept ? "*" : " ", c.knob.c_str(), c.setting.substr(0, 78).c_str(),
                  Percent(c.result.report.ettr).c_str(), Percent(c.result.ettr_true).c_str(),
                  100 * (c.result.ettr_true - first.result.ettr_true));
    }
    std::printf("  (goodput: ETTR less the time slow nodes cost and work redone after corruption; *: a better goodput "
                "than the best before it, carried into the next knob)\n\nrecommended: %s\n  ETTR %s against %s with "
                "the defaults; goodput %s against %s\n",
                recommended.c_str(), Percent(chosen.result.report.ettr).c_str(),
                Percent(first.result.report.ettr).c_str(), Percent(chosen.result.ettr_true).c_str(),
                Percent(first.result.ettr_true).c_str());
    if (chosen.params.checkpoint_policy == "auto") {
      std::printf("  checkpoints: %s\n", CheckpointLine(chosen.params, chosen.result).c_str());
    }
  }
  std::error_code ec;
  fs::create_directories(o.out, ec);
  const fs::path svg = fs::path(o.out) / "plan.svg";
  std::vector<EttrBar> bars;
  for (const auto& c : all) bars.push_back({c.knob + ": " + c.setting, c.result.ettr_true, c.kept});
  std::ofstream(svg) << BarsSvg(bars, "trainguard plan: " + std::string(head));
  std::fprintf(stderr, "trainguard plan: wrote %s\n", svg.c_str());
  return 0;
}

}  // namespace trainguard
