// Steps to naming and false namings per node-hour of the straggler detector,
// swept over slowdown x noise, for the detector shipped and for the one
// before issue 43 (the same code with the CPU-time measure, the pooled noise
// and judging while learning switched off: StragglerPolicy), in one run.
//
// Each run is a synthetic job of --nodes nodes (one rank each) fed to a
// StragglerDetector step by step, as the controller feeds it:
//   - a step's compute is 60 % of --step-s, communication the rest; every
//     node waits for the slowest (its communication is the step's remainder);
//   - noise common to every node at a step (lognormal, 10 %: the data, the
//     machine, a checkpoint), which the peer comparison must cancel;
//   - a node's own noise, lognormal with the swept sigma, and a spike (a GC
//     pause: 1.3-2x) on 0.5 % of its steps; a fixed offset per node (1 %);
//   - from step --slow-from one node's compute is the swept factor slower.
// Two workloads: "gpu", compute timed on the device (the time measure
// alone); "cpu", a CPU job whose compute phases also carry their CPU time,
// which is steadier: its own noise a tenth of the swept sigma (measured on
// this machine: forward's CPU time 0.7 % from step to step where its time
// moved by 10 %), and a slowdown that shows in it (a clock-throttled or
// busier node; a crowded one shows in time only).
//
// Per cell: how many slow runs named the slow node, within 5 steps, the
// median and largest steps to naming (the naming's last step minus the
// first slow step, plus one); namings of any other node (or of the slow one
// before it slowed) are false. Healthy runs (nothing slowed) give the false
// namings per node-hour at --step-s, and per million node-steps (the
// figure that does not depend on the step time).
//
//   build/bench/straggler_sweep_bench [--nodes 16] [--runs 20] [--steps 400]
//       [--healthy-steps 3000] [--step-s 1.0] [--slow-from 150]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "controller/straggler_detector.h"

using namespace trainguard;

namespace {

struct Options {
  int nodes = 16;
  int runs = 20;
  int steps = 400;
  int healthy_steps = 3000;
  double step_s = 1.0;
  int slow_from = 150;
};

struct Job {
  bool cpu_workload = false;
  double sigma = 0.03;     // a node's own noise (lognormal sigma)
  double slowdown = 1.0;   // of the slow node's compute from `slow_from`
  int slow_from = 0;
  int slow_node = 2;
};

struct Outcome {
  std::int64_t named_after = -1;  // steps to naming of the slow node; -1: never named
  int false_namings = 0;
  int false_by_windows = 0;  // of them, by the windows (not the step-by-step test)
  std::int64_t steps = 0;
};

StragglerPolicy Previous() {
  StragglerPolicy p;
  p.cpu_time_measure = false;
  p.pooled_noise = false;
  p.judge_while_learning = false;
  p.refine_mean = false;
  p.window_noise_gate = false;
  return p;
}

Outcome RunJob(const Options& o, const Job& job, const StragglerPolicy& policy, int steps, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0, 1);
  std::uniform_real_distribution<double> uniform(0, 1);
  const double base = o.step_s * 1e6;
  std::vector<double> offset(static_cast<std::size_t>(o.nodes));
  for (double& x : offset) x = std::exp(0.01 * gauss(rng));
  StragglerDetector d(policy);
  d.Reset(o.nodes);
  Outcome out;
  out.steps = steps;
  std::vector<double> compute(offset.size()), cpu(offset.size());
  for (int step = 0; step < steps; ++step) {
    const double common = std::exp(0.10 * gauss(rng));
    for (std::size_t n = 0; n < offset.size(); ++n) {
      double f = common * offset[n] * std::exp(job.sigma * gauss(rng));
      double c = offset[n] * std::exp(job.sigma / 10 * gauss(rng));
      if (uniform(rng) < 0.005) {
        const double spike = 1.3 + 0.7 * uniform(rng);
        f *= spike;
        c *= spike;
      }
      if (static_cast<int>(n) == job.slow_node && step >= job.slow_from) {
        f *= job.slowdown;
        c *= job.slowdown;
      }
      compute[n] = 0.6 * base * f;
      cpu[n] = 0.6 * base * c;
    }
    const double step_us = *std::max_element(compute.begin(), compute.end()) + 0.4 * base * common;
    for (std::size_t n = 0; n < offset.size(); ++n) {
      RankStep s;
      s.node = "n" + std::to_string(n);
      s.rank = static_cast<int>(n);
      s.step = step;
      s.step_us = step_us;
      const std::string prefix = job.cpu_workload ? "" : "gpu:";
      s.phases[prefix + "forward"] = 0.3 * compute[n];
      s.phases[prefix + "backward"] = 0.6 * compute[n];
      s.phases[prefix + "optimizer"] = 0.1 * compute[n];
      if (job.cpu_workload) {
        s.phases["cpu:forward"] = 0.3 * cpu[n];
        s.phases["cpu:optimizer"] = 0.1 * cpu[n];
      }
      s.phases["comm:allreduce"] = step_us - compute[n];
      FillSignals(&s);
      d.Add(s);
    }
    for (const auto& f : d.Evaluate()) {
      if (f.kind != StragglerKind::kStraggler) continue;
      const bool slow_one = f.node == "n" + std::to_string(job.slow_node) && job.slowdown > 1 &&
                            f.last_step >= job.slow_from;
      if (slow_one && out.named_after < 0) {
        out.named_after = f.last_step - job.slow_from + 1;
      } else if (!slow_one) {
        ++out.false_namings;
        out.false_by_windows += f.measure.empty();  // the step-by-step test says its measure
      }
    }
  }
  return out;
}

struct Cell {
  int named = 0, within5 = 0, false_namings = 0;
  std::vector<std::int64_t> after;
};

Cell SlowCell(const Options& o, Job job, const StragglerPolicy& policy, std::uint32_t seed0) {
  Cell cell;
  for (int r = 0; r < o.runs; ++r) {
    Outcome out = RunJob(o, job, policy, job.slow_from + (o.steps - o.slow_from), seed0 + static_cast<std::uint32_t>(r));
    cell.false_namings += out.false_namings;
    if (out.named_after > 0) {
      ++cell.named;
      cell.within5 += out.named_after <= 5;
      cell.after.push_back(out.named_after);
    }
  }
  std::sort(cell.after.begin(), cell.after.end());
  return cell;
}

std::string Show(const Cell& c, int runs) {
  char buf[96];
  if (c.after.empty()) {
    std::snprintf(buf, sizeof(buf), "%2d/%-2d %2d/%-2d %5s %5s %4d", 0, runs, 0, runs, "-", "-", c.false_namings);
  } else {
    std::snprintf(buf, sizeof(buf), "%2d/%-2d %2d/%-2d %5lld %5lld %4d", c.named, runs, c.within5, runs,
                  static_cast<long long>(c.after[c.after.size() / 2]), static_cast<long long>(c.after.back()),
                  c.false_namings);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Straggler detector: steps to naming and false namings, slowdown x noise, shipped and previous"};
  app.add_option("--nodes", o.nodes, "nodes of the synthetic job (3 or more: nodes are judged)")->check(CLI::Range(3, 100000));
  app.add_option("--runs", o.runs, "runs per cell")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "steps of a slow run")->check(CLI::PositiveNumber);
  app.add_option("--healthy-steps", o.healthy_steps, "steps of a healthy run")->check(CLI::PositiveNumber);
  app.add_option("--step-s", o.step_s, "seconds a step (for the rate per node-hour)")->check(CLI::PositiveNumber);
  app.add_option("--slow-from", o.slow_from, "the step the slow node slows at")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.slow_from >= o.steps) {
    std::fprintf(stderr, "--slow-from %d must be below --steps %d\n", o.slow_from, o.steps);
    return 2;
  }
  const StragglerPolicy shipped{}, previous = Previous();
  const std::vector<double> sigmas = {0.01, 0.03, 0.05, 0.10};
  const std::vector<double> slowdowns = {1.05, 1.1, 1.2, 1.5};
  std::printf("%d nodes, %d runs a cell, slow from step %d of %d; columns: runs that named the slow node, named\n"
              "within 5 slow steps, median and largest steps to naming, false namings (other nodes)\n",
              o.nodes, o.runs, o.slow_from, o.steps);
  for (bool cpu_workload : {false, true}) {
    std::printf("\nworkload %s\n%-6s %-9s | %-29s | %-29s\n", cpu_workload ? "cpu (time and CPU time)" : "gpu (device time)",
                "noise", "slowdown", "shipped", "previous");
    for (double sigma : sigmas) {
      for (double slow : slowdowns) {
        Job job{cpu_workload, sigma, slow, o.slow_from};
        const std::uint32_t seed = 1000 * static_cast<std::uint32_t>(sigma * 100) + static_cast<std::uint32_t>(slow * 100);
        std::printf("%4.0f %% %6.2fx   | %s | %s\n", sigma * 100, slow, Show(SlowCell(o, job, shipped, seed), o.runs).c_str(),
                    Show(SlowCell(o, job, previous, seed), o.runs).c_str());
      }
      Job from_start{cpu_workload, sigma, 1.2, 0};
      const std::uint32_t seed = 7000 + static_cast<std::uint32_t>(sigma * 100);
      std::printf("%4.0f %% %6.2fx*  | %s | %s\n", sigma * 100, 1.2, Show(SlowCell(o, from_start, shipped, seed), o.runs).c_str(),
                  Show(SlowCell(o, from_start, previous, seed), o.runs).c_str());
    }
    std::printf("(* slow from the job's first step: steps counted from the first)\n");
    std::printf("\n%-6s | false namings in healthy runs (%d runs x %d steps x %d nodes = %.1f node-hours at %.2f s a step)\n",
                "noise", o.runs, o.healthy_steps, o.nodes, o.runs * static_cast<double>(o.healthy_steps) * o.nodes * o.step_s / 3600,
                o.step_s);
    std::printf("%-6s | %-38s | %-38s\n", "", "shipped: count, /node-hour, /1e6 node-steps", "previous");
    std::printf("%-6s | %-38s | %-38s\n", "", "(of the count, by the windows)", "");
    for (double sigma : sigmas) {
      int counts[2] = {0, 0}, by_windows[2] = {0, 0};
      for (int which = 0; which < 2; ++which) {
        for (int r = 0; r < o.runs; ++r) {
          Job healthy{cpu_workload, sigma, 1.0, 0};
          Outcome out = RunJob(o, healthy, which == 0 ? shipped : previous, o.healthy_steps,
                               90000 + static_cast<std::uint32_t>(sigma * 1000) * 100 + static_cast<std::uint32_t>(r));
          counts[which] += out.false_namings;
          by_windows[which] += out.false_by_windows;
        }
      }
      const double node_steps = static_cast<double>(o.runs) * o.healthy_steps * o.nodes;
      const double node_hours = node_steps * o.step_s / 3600;
      std::printf("%4.0f %% | %5d %10.4f %12.1f (%d) | %5d %10.4f %12.1f (%d)\n", sigma * 100, counts[0],
                  counts[0] / node_hours, counts[0] / node_steps * 1e6, by_windows[0], counts[1], counts[1] / node_hours,
                  counts[1] / node_steps * 1e6, by_windows[1]);
    }
  }
  return 0;
}
