// The straggler detector's change-point test, step by step (its header,
// straggler_detector.h, is the specification): each unit's compute against
// the other units' at the same step, standardised against the unit's own
// baseline, summed over the newest steps; a unit whose sum crosses the
// threshold is named at once, with the change point and the phase that grew.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/stats.h"
#include "controller/straggler_detector.h"
#include "controller/straggler_text.h"

namespace trainguard {

using straggler_text::Ms;
using straggler_text::Percent;

void StragglerDetector::RestartSums(const std::string& unit) {
  // The newest steps' values go with the sums, so that a later naming's
  // figures are read from the same steps as its sums.
  for (auto* measure : {&cusum_, &cpu_cusum_}) {
    auto it = measure->find(unit);
    if (it == measure->end()) continue;
    Cusum& c = it->second;
    c.recent.clear();
    c.excess.clear();
    c.values.clear();
    c.phase_gaps.clear();
  }
}

void StragglerDetector::JudgeStep(std::int64_t step, const std::map<int, StepValue>& values, double step_centre,
                                  std::vector<StragglerFinding>* out) {
  if (policy_.cpu_time_measure) JudgeMeasure(Measure::kCpuTime, step, values, step_centre, out);
  JudgeMeasure(Measure::kTime, step, values, step_centre, out);
}

void StragglerDetector::JudgeMeasure(Measure measure, std::int64_t step, const std::map<int, StepValue>& values,
                                     double step_centre, std::vector<StragglerFinding>* out) {
  const bool cpu_time = measure == Measure::kCpuTime;
  std::map<std::string, Cusum>& cusums = cpu_time ? cpu_cusum_ : cusum_;
  Pool& pool = pools_[cpu_time ? 1 : 0];
  constexpr int kPoolWarmSteps = 10;
  constexpr double kPoolAlpha = 0.05;  // about the last 20 steps
  const double pooled = policy_.pooled_noise && pool.steps >= kPoolWarmSteps ? 1.4826 * pool.mad : 0;
  std::vector<double> deviations;  // this step's, of the units with a baseline
  std::vector<double> baseline_mads;  // of the units whose baseline this step completed
  // Units as the windows have them: nodes from 3 up, else ranks.
  const bool by_node = nodes_seen_.size() >= 3;
  std::map<std::string, std::vector<double>> of_unit;
  std::map<std::string, std::map<std::string, std::vector<double>>> phases_of_unit;
  std::map<std::string, std::pair<int, double>> slowest;  // unit -> (rank, compute)
  std::map<std::string, std::string> node_of;
  for (const auto& [rank, v] : values) {
    const double value = cpu_time ? v.cpu : v.compute;
    if (cpu_time && value <= 0) continue;  // a rank that did not measure it
    std::string key = by_node ? v.node : v.node + "/rank " + std::to_string(rank);
    of_unit[key].push_back(value);
    for (const auto& [phase, us] : cpu_time ? v.cpu_phases : v.phases) phases_of_unit[key][phase].push_back(us);
    node_of[key] = v.node;
    auto& s = slowest[key];
    if (s.first < 0 || value > s.second || of_unit[key].size() == 1) s = {rank, value};
  }
  if (of_unit.size() < 3) return;
  std::map<std::string, double> unit_value;
  for (auto& [key, v] : of_unit) unit_value[key] = Median(v);
  // Each compute phase of each unit against the other units' median at this
  // step (a unit without the phase counts 0): what a naming says grew.
  std::map<std::string, std::map<std::string, double>> phase_gap;  // unit -> phase -> excess µs
  {
    std::set<std::string> phase_names;
    for (const auto& [key, ph] : phases_of_unit) {
      for (const auto& [phase, v] : ph) phase_names.insert(phase);
    }
    for (const std::string& phase : phase_names) {
      std::vector<double> xs;
      for (const auto& [key, x] : unit_value) {
        double value = 0;
        if (auto u = phases_of_unit.find(key); u != phases_of_unit.end()) {
          if (auto it = u->second.find(phase); it != u->second.end()) value = Median(it->second);
        }
        xs.push_back(value);
      }
      const std::vector<double> others = MediansOfOthers(xs);
      std::size_t i = 0;
      for (const auto& [key, x] : unit_value) {
        phase_gap[key][phase] = xs[i] - others[i];
        ++i;
      }
    }
  }
  const double min_log = std::log(1 + policy_.min_slowdown);
  std::vector<double> xs_all;
  xs_all.reserve(unit_value.size());
  for (const auto& [key, x] : unit_value) xs_all.push_back(x);
  const std::vector<double> centres = MediansOfOthers(xs_all);
  // This step's spread across the units (of their log ratios), for the units
  // still learning their baseline.
  double step_spread = 0;
  {
    std::vector<double> abs_lr;
    for (std::size_t i = 0; i < xs_all.size(); ++i) {
      if (xs_all[i] > 0 && centres[i] > 0) abs_lr.push_back(std::fabs(std::log(xs_all[i] / centres[i])));
    }
    if (!abs_lr.empty()) step_spread = 1.4826 * Median(abs_lr);
  }
  std::size_t idx = 0;
  struct FoldPool {  // this step's deviations into the pool, however the loop ends
    Pool& pool;
    std::vector<double>& deviations;
    std::vector<double>& baseline_mads;
    ~FoldPool() {
      if (pool.steps == 0 && !baseline_mads.empty()) {  // the baselines' own, to start from
        pool.mad = Median(baseline_mads);
        pool.steps = kPoolWarmSteps;
      }
      if (deviations.empty()) return;
      const double m = Median(deviations);
      pool.mad = pool.steps == 0 ? m : pool.mad + kPoolAlpha * (m - pool.mad);
      ++pool.steps;
    }
  } fold{pool, deviations, baseline_mads};
  for (const auto& [key, x] : unit_value) {
    const double centre = centres[idx++];
    if (x <= 0 || centre <= 0) continue;
    const double lr = std::log(x / centre);
    Cusum& c = cusums[key];
    const std::size_t n = static_cast<std::size_t>(std::max(policy_.change_steps, 1));
    const bool learning = static_cast<int>(c.baseline.size()) < policy_.change_baseline_steps;
    double mu = c.mu, sigma = std::max(c.sigma, pooled);
    if (learning) {
      c.baseline.push_back(lr);
      if (static_cast<int>(c.baseline.size()) == policy_.change_baseline_steps) {
        const double median = Median(c.baseline);
        std::vector<double> dev;
        for (double b : c.baseline) dev.push_back(std::fabs(b - median));
        c.mu = std::min(median, min_log / 2);  // an offset this large is a slowness, not the unit's own
        c.sigma = std::max(1.4826 * Median(dev), policy_.change_min_spread);
        baseline_mads.push_back(Median(dev));
        if (!baseline_said_) {
          baseline_said_ = true;
          StragglerFinding f;
          f.kind = StragglerKind::kBaseline;
          f.first_step = step - policy_.change_baseline_steps + 1;
          f.last_step = step;
          f.steps = policy_.change_baseline_steps;
          f.message = "straggler detection armed for this generation: each " + std::string(by_node ? "node" : "rank") +
                      "'s compute against its peers' learned over steps " + std::to_string(f.first_step) + "-" +
                      std::to_string(step) + " (its own steps only: the steps before a restart, a spare's " +
                      "promotion or a warm start are not compared); steps from " + std::to_string(step + 1) +
                      " are judged step by step, windows of " + std::to_string(policy_.window_steps) +
                      " steps from the generation's second";
          out->push_back(std::move(f));
        }
        // From here its sums are against its baseline.
        c.recent.clear();
        c.excess.clear();
        c.values.clear();
        c.phase_gaps.clear();
        continue;
      }
      if (!policy_.judge_while_learning) continue;
      // A unit slow from the start has no baseline of its own to be slower
      // than: until it has one, it is judged against its peers directly (its
      // ratio against 1), in the spread of its own steps so far.
      std::vector<double> dev;
      const double m = Median(c.baseline);
      for (double b : c.baseline) dev.push_back(std::fabs(b - m));
      mu = 0;
      sigma = std::max({1.4826 * Median(dev), step_spread, policy_.change_min_spread});
    } else {
      deviations.push_back(std::fabs(lr - mu));
    }
    // Two horizons: the newest change_steps steps, and twice as many with a
    // threshold sqrt(2) times as high (the same rarity under noise alone),
    // which a node slower by fewer standard deviations reaches; while
    // learning, the first only, once it has that many steps.
    c.recent.push_back({step, std::clamp((lr - mu) / sigma, -3.0, 3.0)});
    c.excess.push_back(lr);
    c.values.push_back({x, centre});
    c.phase_gaps.push_back(phase_gap[key]);
    while (c.recent.size() > 2 * n) c.recent.pop_front();
    Streak& streak = streaks_[key];
    while (c.excess.size() > 2 * n) {
      // A step that left both horizons refines the unit's mean (never one
      // still summed: a shift under test does not lower its own sum), by
      // at most 3 deviations (a GC pause moves it little), while the unit
      // is not named (a named unit's slowness is not its new normal), and
      // never above half the threshold (as the baseline's).
      if (policy_.refine_mean && !learning && !streak.reported) {
        constexpr int kMuSteps = 300;
        c.mu_steps = std::min(std::max(c.mu_steps, policy_.change_baseline_steps) + 1, kMuSteps);
        c.mu += std::clamp(c.excess.front() - c.mu, -3 * sigma, 3 * sigma) / c.mu_steps;
        c.mu = std::min(c.mu, min_log / 2);
      }
      c.excess.pop_front();
    }
    while (c.values.size() > 2 * n) c.values.pop_front();
    while (c.phase_gaps.size() > 2 * n) c.phase_gaps.pop_front();
    auto shifted = [&](std::size_t h, double threshold) {
      if (c.recent.size() < h) return false;
      double sum = 0;
      for (std::size_t i = c.recent.size() - h; i < c.recent.size(); ++i) sum += c.recent[i].second;
      return sum >= threshold && Median({c.excess.end() - static_cast<std::ptrdiff_t>(h), c.excess.end()}) >= min_log;
    };
    if (streak.reported || (learning && c.baseline.size() < n) ||
        !(shifted(n, policy_.change_threshold) ||
          (!learning && shifted(2 * n, policy_.change_threshold * std::sqrt(2.0))))) {
      continue;
    }
    // The change point: the start of the newest steps whose excess over half
    // the smallest slowdown adds up to the most (CUSUM's estimate).
    const double half = 0.5 * min_log / sigma;
    std::int64_t since = step;
    std::size_t from = c.recent.size() - 1;
    double acc = 0, best = -1e300;
    for (std::size_t i = c.recent.size(); i-- > 0;) {
      acc += c.recent[i].second - half;
      if (acc > best) {
        best = acc;
        since = c.recent[i].first;
        from = i;
      }
    }
    std::vector<double> xs, cs, ratios;
    std::map<std::string, std::vector<double>> gaps;
    for (std::size_t i = from; i < c.values.size(); ++i) {
      xs.push_back(c.values[i].first);
      cs.push_back(c.values[i].second);
      ratios.push_back(c.values[i].first / c.values[i].second);
      for (const auto& [phase, gap] : c.phase_gaps[i]) gaps[phase].push_back(gap);
    }
    // The phase whose excess over the others' is the largest since the
    // change point ("" when the rank timed none: compute from the step).
    std::string phase;
    double phase_excess = 0;
    for (auto& [name, g] : gaps) {
      const double m = Median(g);
      if (m > phase_excess) {
        phase_excess = m;
        phase = name;
      }
    }
    if (Median(xs) - Median(cs) < policy_.min_step_share * step_centre) continue;  // slower, but it costs nothing
    StragglerFinding f;
    f.kind = StragglerKind::kStraggler;
    f.unit = key;
    f.node = node_of[key];
    f.rank = slowest[key].first;
    f.signal = StragglerSignal::kCompute;
    f.measure = cpu_time ? "cpu_time" : "time";
    f.value_us = Median(xs);
    f.centre_us = Median(cs);
    f.slowdown = Median(ratios) - 1;
    f.phase = phase;
    f.first_step = since;
    f.last_step = step;
    f.steps = step - f.first_step + 1;
    f.message = (by_node ? "node " : "") + key + " is a compute straggler: compute " + Ms(f.value_us) +
                (cpu_time ? " of CPU time" : "") + " per step against the others' median " + Ms(f.centre_us) +
                " (" + Percent(f.slowdown) + " slower" +
                (phase.empty() ? "" : ", most in " + phase + " (+" + Ms(phase_excess) + ")") + ") since step " +
                std::to_string(f.first_step) + ", named after " + std::to_string(f.steps) + " steps (" +
                (learning ? "slower than its peers from the generation's start" : "change point") +
                (cpu_time ? "; CPU time: the rank computes more than its peers" : "") + ")";
    streak.reported = true;
    streak.signal = StragglerSignal::kCompute;
    streak.first_step = f.first_step;
    streak.named_step = step;
    streak.normal = 0;
    RestartSums(key);
    out->push_back(std::move(f));
  }
}

}  // namespace trainguard
