// Cost of the straggler detector per training step as the job grows, under
// the controller's lock: this process feeds one StragglerDetector the steps
// of an N-node job (8 ranks a node) and times Add + Evaluate per step.
// Beside it, in the same run, the baseline it replaced: one median of the
// other units per unit (O(N^2) per step), timed on the same per-step values.
//
//   build/bench/straggler_scale_bench [--nodes 1000,4000,10000] [--steps 12]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "controller/straggler_detector.h"

using namespace trainguard;
using SteadyClock = std::chrono::steady_clock;

namespace {

double Millis(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double NaiveMedian(std::vector<double> v) {
  std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {1000, 4000, 10000};
  int steps = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--nodes") {
      sizes.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string x; std::getline(ss, x, ',');) sizes.push_back(std::atoi(x.c_str()));
    } else if (a == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("%8s %8s %22s %26s\n", "nodes", "ranks", "detector ms/step", "baseline (O(N^2)) ms/step");
  for (int nodes : sizes) {
    StragglerPolicy policy;
    StragglerDetector d(policy);
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> noise(0.97, 1.03);
    SteadyClock::duration spent{};
    std::vector<double> per_node(static_cast<std::size_t>(nodes));
    for (int step = 0; step < steps; ++step) {
      std::vector<RankStep> batch;
      batch.reserve(static_cast<std::size_t>(nodes) * 8);
      for (int n = 0; n < nodes; ++n) {
        for (int r = 0; r < 8; ++r) {
          RankStep s;
          s.node = "node" + std::to_string(n);
          s.rank = 8 * n + r;
          s.step = step;
          s.phases["forward"] = 30000 * noise(rng);
          s.phases["backward"] = 60000 * noise(rng);
          s.phases["cpu:forward"] = 29000 * noise(rng);  // a CPU job: both measures of the step-by-step test run
          s.phases["comm:all_reduce"] = 20000 * noise(rng);
          s.step_us = s.phases["forward"] + s.phases["backward"] + 20000;
          FillSignals(&s);
          if (r == 0) per_node[static_cast<std::size_t>(n)] = s.compute_us;
          batch.push_back(std::move(s));
        }
      }
      auto t0 = SteadyClock::now();
      for (const RankStep& s : batch) d.Add(s);
      d.Evaluate();
      spent += SteadyClock::now() - t0;
    }
    // The replaced computation, once per step (each of the two callers did it once).
    auto t0 = SteadyClock::now();
    double sink = 0;
    for (std::size_t k = 0; k < per_node.size(); ++k) {
      std::vector<double> others;
      others.reserve(per_node.size());
      for (std::size_t j = 0; j < per_node.size(); ++j) {
        if (j != k) others.push_back(per_node[j]);
      }
      sink += NaiveMedian(others);
    }
    double baseline = Millis(SteadyClock::now() - t0);
    std::printf("%8d %8d %22.2f %26.2f%s\n", nodes, nodes * 8, Millis(spent) / steps, baseline, sink < 0 ? "!" : "");
  }
  return 0;
}
