#include "controller/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/stats.h"
#include "controller/straggler_text.h"

namespace trainguard {
namespace {

std::int64_t FloorDiv(std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

// The spread (sigma, from the MAD) of one step's log ratio in a window,
// pooled over the units: each step's distance from its own unit's median.
// A slow unit is far from the others, not from its own median, so it does
// not widen it.
double WindowStepSpread(const std::map<std::string, std::vector<double>>& ratios) {
  std::vector<double> dev, counts;
  for (const auto& [key, r] : ratios) {
    std::vector<double> logs;
    for (double x : r) {
      if (x > 0) logs.push_back(std::log(x));
    }
    if (logs.size() < 2) continue;
    const double m = Median(logs);
    for (double l : logs) dev.push_back(std::fabs(l - m));
    counts.push_back(static_cast<double>(logs.size()));
  }
  if (dev.empty()) return 0;
  // Distances from a median of n of the same samples are short by about
  // 1.3 / n of the spread (simulated: 0.87 at n = 10, 0.73 at 5): an
  // understated spread let noise cross the gate 2.7 times as often.
  const double n = Median(counts);
  return 1.4826 * Median(dev) * n / std::max(n - 1.3, 0.7);
}

using straggler_text::Ms;
using straggler_text::Percent;

// One judged unit (a node, or a rank when the job has fewer than 3 nodes).
struct Unit {
  std::string key;
  std::string node;
  int slowest_rank = -1;
  double compute = 0, comm = 0, step = 0;
  std::map<std::string, double> phases;
  // Waiting in the "data" phase: a rank's median; a node's, its slowest
  // rank's (one starved loader holds the whole job), and which rank.
  double data = 0;
  int data_rank = -1;
};

}  // namespace

std::vector<double> MediansOfOthers(const std::vector<double>& v) {
  std::vector<double> out(v.size(), 0);
  if (v.size() < 2) return out;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  const std::size_t m = s.size() - 1;  // how many remain once one is left out
  for (std::size_t k = 0; k < v.size(); ++k) {
    // Leaving out any copy of v[k] leaves the same values; take the first.
    const std::size_t i = static_cast<std::size_t>(std::lower_bound(s.begin(), s.end(), v[k]) - s.begin());
    auto at = [&](std::size_t j) { return j < i ? s[j] : s[j + 1]; };
    out[k] = m % 2 == 1 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
  }
  return out;
}


bool IsComputePhase(const std::string& key) {
  std::string k = key.rfind("gpu:", 0) == 0 ? key.substr(4) : key;
  return k == "forward" || k == "backward" || k == "optimizer";
}

bool IsCpuTimeKey(const std::string& key) { return key == "cpu:forward" || key == "cpu:optimizer"; }

void FillSignals(RankStep* s) {
  double cpu = 0, gpu = 0, comm = 0, cpu_time = 0;
  for (const auto& [key, us] : s->phases) {
    if (key.rfind("comm:", 0) == 0) {
      comm += us;
    } else if (IsCpuTimeKey(key)) {
      cpu_time += us;
    } else if (key.rfind("gpu:", 0) == 0) {
      if (IsComputePhase(key)) gpu += us;
    } else if (key == "forward" || key == "optimizer") {
      // Not backward: under DDP it ends waiting for the slowest rank's
      // gradients, so the fast ranks' backward is the long one.
      cpu += us;
    }
  }
  s->comm_us = comm;
  // A rank that timed its compute on a device computes there: its CPU time
  // in forward is launching kernels, which says nothing of its pace.
  s->cpu_us = gpu > 0 ? 0 : cpu_time;
  s->compute_us = gpu > 0 ? gpu : cpu > 0 ? cpu : std::max(0.0, s->step_us - comm);
}

void StragglerDetector::Add(const RankStep& step) {
  if (steps_from_ == INT64_MIN) {
    steps_from_ = (FloorDiv(step.step, policy_.window_steps) + 1) * policy_.window_steps;
  }
  nodes_seen_.insert(step.node);
  if (step.step >= steps_from_ && step.step >= stepped_below_) {
    StepValue& v = step_values_[step.step][step.rank];
    v.node = step.node;
    v.compute = step.compute_us;
    v.cpu = step.cpu_us;
    for (const auto& [key, us] : step.phases) {
      if (IsComputePhase(key)) v.phases[key] = us;
      if (IsCpuTimeKey(key)) v.cpu_phases[key.substr(4)] = us;
    }
    step_durations_[step.step].push_back(step.step_us);
  }
  Delivery& d = delivered_[step.rank];
  if (d.round != round_) d = {round_, 0};
  round_batch_ = std::max(round_batch_, ++d.steps);
  std::int64_t index = FloorDiv(step.step, policy_.window_steps);
  if (index < judged_below_) return;  // a window already judged
  windows_[index].by_rank[step.rank].push_back(step);
  auto [it, added] = rank_last_.emplace(step.rank, step.step);
  if (added) {
    ++last_counts_[step.step];
  } else if (step.step > it->second) {
    if (--last_counts_[it->second] == 0) last_counts_.erase(it->second);
    ++last_counts_[step.step];
    it->second = step.step;
  }
}

void StragglerDetector::Reset(int world_size) {
  world_size_ = world_size;
  windows_.clear();
  rank_last_.clear();
  last_counts_.clear();
  judged_below_ = INT64_MIN;
  for (auto& [key, streak] : streaks_) {
    streak.slow = 0;
    streak.normal = 0;
  }
  baseline_steps_.clear();
  baseline_phases_.clear();
  trend_slow_ = 0;
  trend_said_ = false;
  skip_window_ = true;
  cusum_.clear();
  cpu_cusum_.clear();
  pools_[0] = pools_[1] = Pool();
  baseline_said_ = false;
  step_values_.clear();
  step_durations_.clear();
  nodes_seen_.clear();
  steps_from_ = INT64_MIN;
  stepped_below_ = INT64_MIN;
  delivered_.clear();
  round_batch_ = 0;
  batch_ = 0;
}

void StragglerDetector::RestoreReported(const std::string& unit, StragglerSignal signal, std::int64_t first_step,
                                        std::int64_t named_step, bool evict_said) {
  Streak& s = streaks_[unit];
  s.reported = true;
  s.named_step = std::max(named_step, first_step);
  s.evict_said = s.evict_said || evict_said;
  s.signal = signal;
  s.first_step = first_step;
}

std::set<std::string> StragglerDetector::Stragglers() const {
  std::set<std::string> out;
  for (const auto& [key, s] : streaks_) {
    if (s.reported) out.insert(key);
  }
  return out;
}

std::int64_t StragglerDetector::Margin() const {
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(2 * batch_)), policy_.window_steps,
                                  3 * static_cast<std::int64_t>(policy_.window_steps));
}

std::vector<StragglerFinding> StragglerDetector::Evaluate() {
  std::vector<StragglerFinding> out;
  if (round_batch_ > 0) {
    // A moving mean over rounds: a backlog brought once (a reconnected
    // agent, a restarted controller) widens the margin for a few rounds,
    // not for the rest of the generation.
    batch_ = batch_ <= 0 ? round_batch_ : batch_ + 0.25 * (round_batch_ - batch_);
  }
  round_batch_ = 0;
  ++round_;
  const std::int64_t margin = Margin();
  {
    std::int64_t min_last = last_counts_.empty() ? INT64_MAX : last_counts_.begin()->first;
    std::int64_t max_last = last_counts_.empty() ? INT64_MIN : last_counts_.rbegin()->first;
    while (!step_values_.empty()) {
      auto it = step_values_.begin();
      // Complete as a window is: every rank past it, or some rank `margin` steps further.
      bool everyone = static_cast<int>(rank_last_.size()) >= world_size_ && min_last >= it->first;
      if (!everyone && max_last < it->first + margin) break;
      JudgeStep(it->first, it->second, Median(step_durations_[it->first]), &out);
      stepped_below_ = it->first + 1;
      step_durations_.erase(it->first);
      step_values_.erase(it);
    }
  }
  while (!windows_.empty()) {
    auto it = windows_.begin();
    std::int64_t last_step = (it->first + 1) * policy_.window_steps - 1;
    // The ranks' newest steps, lowest and highest: from their counts, not a
    // pass over 100,000 ranks at every Timings message.
    std::int64_t min_last = last_counts_.empty() ? INT64_MAX : last_counts_.begin()->first;
    std::int64_t max_last = last_counts_.empty() ? INT64_MIN : last_counts_.rbegin()->first;
    // Complete when every rank is past it, or some rank `margin` steps further.
    bool everyone = static_cast<int>(rank_last_.size()) >= world_size_ && min_last >= last_step;
    if (!everyone && max_last < last_step + margin) break;
    Judge(it->first, it->second, &out);
    JudgeTrend(it->first, it->second, &out);
    judged_below_ = it->first + 1;
    windows_.erase(it);
  }
  return out;
}

void StragglerDetector::Judge(std::int64_t index, const Window& w, std::vector<StragglerFinding>* out) {
  // Per rank: medians over the window's steps.
  std::map<std::string, std::vector<std::pair<int, const std::vector<RankStep>*>>> by_node;
  for (const auto& [rank, steps] : w.by_rank) {
    if (!steps.empty()) by_node[steps.front().node].push_back({rank, &steps});
  }
  auto rank_unit = [](int rank, const std::vector<RankStep>& steps) {
    Unit u;
    u.node = steps.front().node;
    u.slowest_rank = rank;
    std::vector<double> compute, comm, step;
    std::map<std::string, std::vector<double>> phases;
    for (const RankStep& s : steps) {
      compute.push_back(s.compute_us);
      comm.push_back(s.comm_us);
      step.push_back(s.step_us);
      for (const auto& [k, v] : s.phases) phases[k].push_back(v);
    }
    u.compute = Median(compute);
    u.comm = Median(comm);
    u.step = Median(step);
    for (auto& [k, v] : phases) u.phases[k] = Median(v);
    auto d = u.phases.find("data");
    u.data = d == u.phases.end() ? 0 : d->second;
    u.data_rank = rank;
    return u;
  };
  std::vector<Unit> units;
  if (by_node.size() >= 3) {
    for (const auto& [node, ranks] : by_node) {
      std::vector<Unit> rs;
      for (const auto& [rank, steps] : ranks) rs.push_back(rank_unit(rank, *steps));
      Unit u;
      u.key = node;
      u.node = node;
      std::vector<double> compute, comm, step;
      std::map<std::string, std::vector<double>> phases;
      double worst = -1;
      for (const Unit& r : rs) {
        compute.push_back(r.compute);
        comm.push_back(r.comm);
        step.push_back(r.step);
        for (const auto& [k, v] : r.phases) phases[k].push_back(v);
        if (r.compute > worst) {
          worst = r.compute;
          u.slowest_rank = r.slowest_rank;
        }
        if (u.data_rank < 0 || r.data > u.data) {
          u.data = r.data;
          u.data_rank = r.slowest_rank;
        }
      }
      u.compute = Median(compute);
      u.comm = Median(comm);
      u.step = Median(step);
      for (auto& [k, v] : phases) u.phases[k] = Median(v);
      units.push_back(std::move(u));
    }
  } else {
    for (const auto& [node, ranks] : by_node) {
      for (const auto& [rank, steps] : ranks) {
        Unit u = rank_unit(rank, *steps);
        u.key = node + "/rank " + std::to_string(rank);
        units.push_back(std::move(u));
      }
    }
  }
  if (units.size() < 3) return;  // with two, which one is the slow one?

  // Per step, each unit against the median of the others at that step (so
  // that what slows every node, the machine or the data, cancels out); a
  // unit's window ratio is the median of its per-step ratios.
  std::map<std::string, std::map<std::int64_t, std::pair<std::vector<double>, std::vector<double>>>> per_step;
  for (const auto& [rank, steps] : w.by_rank) {
    for (const RankStep& st : steps) {
      std::string key = units.front().key == units.front().node ? st.node : st.node + "/rank " + std::to_string(rank);
      auto& slot = per_step[key][st.step];
      slot.first.push_back(st.compute_us);
      slot.second.push_back(st.comm_us);
    }
  }
  // Units at or above the threshold whose window is within what noise
  // moves a window's median: neither slow nor keeping pace (in compute or
  // in communication: either keeps a unit from counting a normal window).
  std::set<std::string> undecided;
  auto slow_set = [&](bool comm, double* centre_out, std::map<std::string, double>* ratio_out) {
    std::map<std::int64_t, std::map<std::string, double>> at;  // step -> unit -> value
    for (const auto& [key, steps] : per_step) {
      for (const auto& [step, v] : steps) at[step][key] = Median(comm ? v.second : v.first);
    }
    std::map<std::string, std::vector<double>> ratios;
    for (const auto& [step, values] : at) {
      if (values.size() < 3) continue;
      std::vector<double> xs;
      xs.reserve(values.size());
      for (const auto& [key, x] : values) xs.push_back(x);
      const std::vector<double> centres = MediansOfOthers(xs);
      std::size_t i = 0;
      for (const auto& [key, x] : values) {
        const double c = centres[i++];
        if (c > 0) ratios[key].push_back(x / c);
      }
    }
    std::vector<double> unit_values;
    for (const Unit& u : units) unit_values.push_back(comm ? u.comm : u.compute);
    *centre_out = Median(unit_values);
    std::set<std::string> slow;
    std::vector<double> steps;
    std::map<std::string, double> value_of;
    for (const Unit& u : units) {
      steps.push_back(u.step);
      value_of[u.key] = comm ? u.comm : u.compute;
    }
    const double step_centre = Median(steps);
    // The median of k noisy steps is itself noisy (1.2533 sigma / sqrt(k)):
    // where a step's compute moves by 10 %, a window's median moves by 4 %,
    // and 7 % would be crossed by noise alone in one window of 25.
    const double spread = policy_.window_noise_gate ? WindowStepSpread(ratios) : 0;
    for (auto& [key, r] : ratios) {
      if (static_cast<int>(r.size()) * 2 < policy_.window_steps) continue;  // too few steps to say
      double ratio = Median(r);
      (*ratio_out)[key] = ratio;
      const bool costs = value_of[key] - *centre_out >= policy_.min_step_share * step_centre;
      const bool beyond_noise =
          std::log(ratio) >= policy_.window_z * 1.2533 * spread / std::sqrt(static_cast<double>(r.size()));
      if (ratio >= 1 + policy_.min_slowdown && costs) (beyond_noise ? slow : undecided).insert(key);
    }
    return slow;
  };
  double compute_centre = 0, comm_centre = 0;
  std::map<std::string, double> compute_ratio, comm_ratio;
  std::set<std::string> slow_compute = slow_set(false, &compute_centre, &compute_ratio);
  std::set<std::string> slow_comm = slow_set(true, &comm_centre, &comm_ratio);
  // Waiting for data: a unit whose wait exceeds the units' median wait by
  // min_slowdown of the median step. Its compute is the others' (data is
  // not compute), and the others wait for it in their collectives, so
  // neither signal above shows it.
  std::set<std::string> slow_data;
  double data_centre = 0, step_centre = 0;
  {
    std::vector<double> data, step;
    for (const Unit& u : units) {
      data.push_back(u.data);
      step.push_back(u.step);
    }
    data_centre = Median(data);
    step_centre = Median(step);
    for (const Unit& u : units) {
      if (step_centre > 0 && u.data - data_centre >= policy_.min_slowdown * step_centre) slow_data.insert(u.key);
    }
  }
  // The others wait for a unit slow to compute or to get its data inside
  // their collectives: their long communication is that wait, not theirs.
  if (!slow_compute.empty() || !slow_data.empty()) {
    for (auto it = slow_comm.begin(); it != slow_comm.end();) {
      it = slow_compute.count(*it) || slow_data.count(*it) ? std::next(it) : slow_comm.erase(it);
    }
  }
  if (skip_window_) {  // the generation's first window: start-up, not pace
    skip_window_ = false;
    return;
  }

  // The phase of `u` furthest above the units' median of that phase.
  auto worst_phase = [&](const Unit& u, bool comm) {
    std::string best;
    double best_gap = 0;
    for (const auto& [k, v] : u.phases) {
      bool is_comm = k.rfind("comm:", 0) == 0;
      if (is_comm != comm || (!comm && !IsComputePhase(k) && k != "gc")) continue;
      std::vector<double> others;
      for (const Unit& o : units) {
        auto it = o.phases.find(k);
        others.push_back(it == o.phases.end() ? 0 : it->second);
      }
      double gap = v - Median(others);
      if (gap > best_gap) {
        best_gap = gap;
        best = k;
      }
    }
    return best;
  };

  // Who entered each collective last (clock uncertainty aside: the gap to
  // the next-to-last must be positive).
  std::map<std::pair<int, std::int64_t>, std::vector<std::pair<double, std::string>>> entries;
  for (const auto& [rank, steps] : w.by_rank) {
    for (const RankStep& st : steps) {
      std::string key = units.front().key == units.front().node ? st.node : st.node + "/rank " + std::to_string(rank);
      for (const auto& [group, seq, at] : st.collectives) entries[{group, seq}].push_back({at, key});
    }
  }
  std::map<std::string, std::pair<int, int>> last_of;  // unit -> (entered last, took part)
  for (auto& [op, who] : entries) {
    if (who.size() < 2) continue;
    std::sort(who.begin(), who.end());
    std::set<std::string> took_part;
    for (const auto& [at, key] : who) took_part.insert(key);
    if (took_part.size() < 2) continue;
    for (const auto& key : took_part) ++last_of[key].second;
    if (who.back().first > who[who.size() - 2].first) ++last_of[who.back().second].first;
  }

  std::int64_t first = index * policy_.window_steps;
  std::int64_t last = first + policy_.window_steps - 1;
  for (const Unit& u : units) {
    Streak& s = streaks_[u.key];
    bool compute = slow_compute.count(u.key) > 0;
    bool data = slow_data.count(u.key) > 0;
    // Both: the one that costs the step more time (a tiny model's compute
    // 14 % slower is a tenth of a millisecond beside a 50 ms wait for data).
    if (compute && data) (u.compute - compute_centre >= u.data - data_centre ? data : compute) = false;
    bool comm = !compute && !data && slow_comm.count(u.key) > 0;
    if (compute || comm || data) {
      if (s.slow == 0 && !s.reported) s.first_step = first;
      ++s.slow;
      s.normal = 0;
      s.signal = compute ? StragglerSignal::kCompute : comm ? StragglerSignal::kCommunication : StragglerSignal::kData;
    } else if (undecided.count(u.key)) {
      s.normal = 0;  // not evidence of slowness, nor of keeping pace
    } else {
      s.slow = std::max(0, s.slow - 1);
      // A window that ended before the unit's naming is evidence the naming
      // already weighed: it clears nothing.
      if (!s.reported || last > s.named_step) ++s.normal;
    }
    bool report = (compute || comm || data) && s.slow >= policy_.windows_to_report && !s.reported;
    bool evict = (compute || comm || data) && s.slow >= policy_.windows_to_evict && !s.evict_said;
    if ((report || evict) && data) {
      StragglerFinding f;
      f.kind = StragglerKind::kStraggler;
      f.unit = u.key;
      f.node = u.node;
      f.rank = u.data_rank;
      f.signal = StragglerSignal::kData;
      f.phase = "data";
      f.value_us = u.data;
      f.centre_us = data_centre;
      f.slowdown = (u.data - data_centre) / step_centre;
      f.first_step = s.first_step;
      f.last_step = last;
      f.steps = last - s.first_step + 1;
      f.evict = s.slow >= policy_.windows_to_evict;
      f.message = (units.front().key == units.front().node ? "node " : "") + u.key +
                  " is a data straggler: rank " + std::to_string(f.rank) + " waits for data " + Ms(f.value_us) +
                  " per step against the others' median " + Ms(f.centre_us) + " (" + Percent(f.slowdown) +
                  " of the step; its data loader or its storage holds the job) for " + std::to_string(f.steps) +
                  " steps (" + std::to_string(f.first_step) + "-" + std::to_string(f.last_step) + ")";
      if (!s.reported) s.named_step = last;
      s.reported = true;
      if (f.evict) s.evict_said = true;
      out->push_back(std::move(f));
    } else if (report || evict) {
      StragglerFinding f;
      f.kind = StragglerKind::kStraggler;
      f.unit = u.key;
      f.node = u.node;
      f.rank = u.slowest_rank;
      f.signal = s.signal;
      f.phase = worst_phase(u, comm);
      f.value_us = compute ? u.compute : u.comm;
      f.centre_us = compute ? compute_centre : comm_centre;
      f.slowdown = (compute ? compute_ratio[u.key] : comm_ratio[u.key]) - 1;
      auto lo = last_of.find(u.key);
      if (lo != last_of.end() && lo->second.second > 0) {
        f.last_to_enter = static_cast<double>(lo->second.first) / lo->second.second;
      }
      f.first_step = s.first_step;
      f.last_step = last;
      f.steps = last - s.first_step + 1;
      f.evict = s.slow >= policy_.windows_to_evict;
      f.message = (units.front().key == units.front().node ? "node " : "") + u.key + " is a " +
                  StragglerSignalName(s.signal) + " straggler: " + (compute ? "compute " : "communication ") + Ms(f.value_us) +
                  " per step against the others' median " + Ms(f.centre_us) + " (" + Percent(f.slowdown) +
                  " slower" + (f.phase.empty() ? "" : ", most in " + f.phase) +
                  (f.last_to_enter >= 0 ? ", last to enter " + Percent(f.last_to_enter) + " of its collectives" : "") +
                  ") for " +
                  std::to_string(f.steps) + " steps (" + std::to_string(f.first_step) + "-" +
                  std::to_string(f.last_step) + ")";
      if (!s.reported) s.named_step = last;
      s.reported = true;
      if (f.evict) s.evict_said = true;
      out->push_back(std::move(f));
    } else if (s.reported && s.normal >= policy_.windows_to_clear) {
      StragglerFinding f;
      f.kind = StragglerKind::kCleared;
      f.unit = u.key;
      f.node = u.node;
      f.rank = u.slowest_rank;
      f.signal = s.signal;
      f.first_step = last - static_cast<std::int64_t>(s.normal) * policy_.window_steps + 1;
      f.last_step = last;
      f.steps = last - f.first_step + 1;
      f.message = (units.front().key == units.front().node ? "node " : "") + u.key + " keeps pace again (" +
                  std::to_string(s.normal) + " windows of " + std::to_string(policy_.window_steps) +
                  " steps within the job's median, steps " + std::to_string(f.first_step) + "-" +
                  std::to_string(last) + ", after it was named at step " + std::to_string(s.named_step) + ")";
      out->push_back(std::move(f));
      s = Streak();
      RestartSums(u.key);
    }
  }
}

void StragglerDetector::JudgeTrend(std::int64_t index, const Window& w, std::vector<StragglerFinding>* out) {
  std::vector<double> steps;
  std::map<std::string, std::vector<double>> phases;
  for (const auto& [rank, rs] : w.by_rank) {
    for (const RankStep& s : rs) {
      steps.push_back(s.step_us);
      for (const auto& [k, v] : s.phases) phases[k].push_back(v);
    }
  }
  if (steps.empty()) return;
  double now = Median(steps);
  if (static_cast<int>(baseline_steps_.size()) < policy_.trend_baseline_windows) {
    if (baseline_steps_.empty()) trend_first_step_ = index * policy_.window_steps;
    baseline_steps_.push_back(now);
    for (auto& [k, v] : phases) baseline_phases_[k] += Median(v) / policy_.trend_baseline_windows;
    return;
  }
  double base = Median(baseline_steps_);
  double growth = base > 0 ? now / base - 1 : 0;
  if (growth < policy_.trend_threshold) {
    trend_slow_ = 0;
    if (growth < policy_.trend_threshold / 2) trend_said_ = false;
    return;
  }
  if (++trend_slow_ < policy_.trend_windows || trend_said_) return;
  trend_said_ = true;
  StragglerFinding f;
  f.kind = StragglerKind::kSlowTrend;
  f.value_us = now;
  f.centre_us = base;
  f.slowdown = growth;
  f.first_step = trend_first_step_;
  f.last_step = (index + 1) * policy_.window_steps - 1;
  f.steps = f.last_step - f.first_step + 1;
  double best_gap = 0;
  for (auto& [k, v] : phases) {
    auto b = baseline_phases_.find(k);
    double gap = Median(v) - (b == baseline_phases_.end() ? 0 : b->second);
    if (gap > best_gap) {
      best_gap = gap;
      f.phase = k;
    }
  }
  f.message = "step time grew " + Percent(growth) + " over the last " + std::to_string(f.steps) + " steps (" +
              Ms(base) + " -> " + Ms(now) + ")" +
              (f.phase.empty() ? "" : ", in phase " + f.phase + " (+" + Ms(best_gap) + " per step)");
  out->push_back(std::move(f));
}

EventKind StragglerEventKind(StragglerKind kind) {
  switch (kind) {
    case StragglerKind::kStraggler: return EventKind::kStraggler;
    case StragglerKind::kCleared: return EventKind::kStragglerCleared;
    case StragglerKind::kSlowTrend: return EventKind::kSlowTrend;
    case StragglerKind::kBaseline: return EventKind::kStragglerBaseline;
  }
  return EventKind::kStraggler;
}

const char* StragglerSignalName(StragglerSignal signal) {
  switch (signal) {
    case StragglerSignal::kNone: return "";
    case StragglerSignal::kCompute: return "compute";
    case StragglerSignal::kCommunication: return "communication";
    case StragglerSignal::kData: return "data";
  }
  return "";
}

StragglerSignal StragglerSignalFromName(const std::string& name) {
  for (StragglerSignal s : {StragglerSignal::kCompute, StragglerSignal::kCommunication, StragglerSignal::kData}) {
    if (name == StragglerSignalName(s)) return s;
  }
  return StragglerSignal::kNone;
}

Finding StragglerFailure(const StragglerFinding& f, const std::string& cause, Nanos now_wall,
                         const std::string& detail_json) {
  Finding out;
  out.kind = FindingKind::kStraggler;
  out.description = f.message;
  out.node = f.node;
  out.rank = f.rank;
  out.rank_step = f.last_step;
  out.fault_wall = now_wall;
  out.lines.push_back({f.rank, f.node, "trainguard: " + f.message});
  out.detail_json = detail_json;
  DetectorVerdict v;
  switch (f.signal) {
    case StragglerSignal::kCommunication:
      v.rule_id = "straggler-communication";
      v.category = "network";
      v.description = "a node spent markedly longer in its collectives than the job's other nodes for many "
                      "steps, with its compute at the job's pace: its links are slow";
      break;
    case StragglerSignal::kData:
      v.rule_id = "straggler-data";
      v.category = "storage";
      v.hardware = false;  // its loader or its mount of the storage, not a part known to be bad
      v.description = "a node's ranks waited markedly longer for their input data than the job's other nodes' "
                      "for many steps (its data loader, or its storage or its mount of it): every rank waited "
                      "for it";
      break;
    case StragglerSignal::kCompute:
    case StragglerSignal::kNone:
      v.rule_id = "straggler-compute";
      v.category = "other";
      v.description = "a node computed markedly slower than the job's other nodes for many steps (a "
                      "throttled CPU or GPU, a degraded part, a noisy neighbour): every rank waited for it";
      break;
  }
  // A data straggler's cause is its signal itself.
  if (!cause.empty() && f.signal != StragglerSignal::kData) v.description += "; its telemetry: " + cause;
  v.evict_nodes = {f.node};
  out.verdict = v;
  return out;
}

}  // namespace trainguard
