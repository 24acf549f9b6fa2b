// trainguard sim: stragglers (simulation.h). A node slows down for a while
// (the failure model's stragglers); training being synchronous, every step
// of the job takes as long as the slowest node's. While a node of the job is
// slow, the nodes watched — the slow ones and 15 healthy peers drawn at
// random — send their steps' timings to the controller, as agents send
// theirs, and its straggler detector judges them: it names the node (an
// event), or under --straggler-action evict has it replaced.
//
// What is simplified, and why (docs/simulator.md, Limits):
//  - timings flow only around a slowdown in a node's compute: from 80 steps
//    before it (the next slowdown is drawn ahead, so its place starts
//    sending in time: the detector's baseline) to 40 steps after it,
//    without 100,000 ranks' timings every step of a month;
//  - a node sends one rank's timings (the detector takes a node's median
//    rank: one rank is that median);
//  - the detector judges a step once every rank has sent it, or once some
//    rank is a window further: with a sample, always the latter, a window
//    (10 steps) later than in a job whose every node sends.
#include <algorithm>
#include <cmath>

#include "sim/simulation.h"

namespace trainguard::sim_detail {

namespace {

constexpr int kPeers = 15;              // healthy nodes watched beside the slow ones
constexpr std::int64_t kBackfill = 80;  // steps before a slowdown sent with it (the detector's baseline)
constexpr std::int64_t kAfter = 40;     // steps sent after the last slowdown ended (3 windows clear a node)

// A normal deviate from (generation, step, who): the same for every send of
// the same step, drawn from no stream.
double Noise(std::int64_t generation, std::int64_t step, std::int64_t who) {
  auto mix = [](std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  };
  std::uint64_t h = mix(mix(mix(static_cast<std::uint64_t>(generation)) ^ static_cast<std::uint64_t>(step)) ^
                        static_cast<std::uint64_t>(who));
  const double u1 = (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = (static_cast<double>(mix(h) >> 11) + 0.5) / 9007199254740992.0;
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Log-uniform over [lo, hi] from a uniform `u` in [0, 1).
double LogUniform(double u, double lo, double hi) { return lo * std::exp(u * std::log(hi / lo)); }

}  // namespace

void Simulation::ScheduleNextSlow() {
  const StragglerModel& m = model_.stragglers;
  if (!m.enabled()) return;
  const double per_s = m.per_node_day * (nnodes_ + p_.spares) / 86400.0;
  auto uniform = [&] { return std::uniform_real_distribution<double>(0.0, 1.0)(slow_rng_); };
  const Nanos now = clock_.MonotonicNanos();
  const Nanos at = now + Sec(-std::log(1.0 - uniform()) / per_s);
  // A place at random: the job's slots, then the spares'.
  const int places = nnodes_ + p_.spares;
  next_slow_.place = std::min(places - 1, static_cast<int>(uniform() * places));
  next_slow_.factor = LogUniform(uniform(), m.slowdown_min, m.slowdown_max);
  next_slow_.minutes = LogUniform(uniform(), m.minutes_min, m.minutes_max);
  next_slow_.visible = uniform() < m.on_node;
  Schedule(at, Ev::kSlow);
  // Every agent sends its timings at every heartbeat: the detector has
  // the node's steps from before it slows. The simulation sends them from
  // that long before.
  if (next_slow_.place < nnodes_ && next_slow_.visible) {
    Schedule(std::max(now, at - Sec(kBackfill * gen_.step_s)), Ev::kPreWatch);
  }
}

void Simulation::PreWatch() {
  watch_.pending = next_slow_.place;
  Watch(clock_.MonotonicNanos());
}

bool Simulation::InJob(int node) const {
  const Node& n = nodes_[node];
  return n.alive && !n.gone && n.group_rank >= 0 && n.generation == gen_.g && n.ranks_running;
}

void Simulation::Slow() {
  const Nanos now = clock_.MonotonicNanos();
  const int k = next_slow_.place;
  const double factor = next_slow_.factor, minutes = next_slow_.minutes;
  const bool visible = next_slow_.visible;
  watch_.pending = -1;
  // Watched for it: unless it slows the job, the watch ends as after a slowdown.
  if (watch_.on && gen_.slowdown == 1) watch_.until = StepAt(now) + kAfter;
  ++result_.slowdowns;
  ++result_.categories[straggler_category_].injected;
  const int node = k >= nnodes_ ? IdleSpare(k - nnodes_) : k < static_cast<int>(slot_node_.size()) ? slot_node_[k] : -1;
  if (node < 0 || !nodes_[node].alive) return;
  Node& n = nodes_[node];
  if (n.slow > factor) return;  // slower already
  const bool in_job = InJob(node);
  if (in_job && visible) {
    // Timings flow from the steps before it (the detector's baseline), sent at the old pace.
    Watch(now);
    if (watch_.on) SendTimings(now, n.group_rank);
  }
  n.slow = factor;
  n.slow_visible = visible;
  n.slow_id = ++slow_seq_;
  slow_nodes_.insert(node);
  Schedule(now + Sec(minutes * 60), Ev::kSlowEnd, node, n.slow_id);
  SimSlowdown s;
  s.node = n.id;
  s.start_s = ToSec(now - start_mono_);
  s.end_s = s.start_s + minutes * 60;
  s.slowdown = factor;
  s.visible = visible;
  s.in_job = in_job;
  result_.slowdown_list.push_back(s);
  if (in_job) {
    ++result_.slowdowns_in_job;
    Repace(now);
  }
}

void Simulation::SlowEnds(int node, std::int64_t id) {
  Node& n = nodes_[node];
  if (n.slow_id != id) return;
  const bool in_job = InJob(node);
  const Nanos now = clock_.MonotonicNanos();
  if (in_job && watch_.on) SendTimings(now);  // its steps at the slow pace
  if (in_job && n.slow_visible && watch_.paused && watch_.generation == gen_.g) {
    // Named and watched no more while it stayed slow: the detector sees it recover (and clears it).
    watch_.paused = false;
    watch_.on = true;
    for (auto& [slot, to] : watch_.sent_to) to = std::max(to, StepAt(now));
    Schedule(now + Sec(kTimingsEvery * gen_.step_s), Ev::kTimings, -1, gen_.g);
  }
  n.slow = 1;
  n.slow_visible = false;
  slow_nodes_.erase(node);
  if (in_job) Repace(now);
}

void Simulation::CountSlowed(Nanos now) {
  if (gen_.slowdown > 1 && gen_.first != kNever) {
    const Nanos from = std::max(gen_.slow_mark, gen_.first);
    const Nanos to = std::min(now, gen_.frozen);
    if (to > from) {
      result_.slow_s += ToSec(to - from);
      result_.slowed_s += ToSec(to - from) * (1 - 1 / gen_.slowdown);
    }
  }
  gen_.slow_mark = now;
}

void Simulation::Repace(Nanos now) {
  double factor = 1;
  for (int node : slow_nodes_) {
    if (InJob(node)) factor = std::max(factor, nodes_[node].slow);
  }
  if (factor == gen_.slowdown) return;
  CountSlowed(now);
  // The timings of the steps made at the old pace go first.
  if (watch_.on) SendTimings(now);
  const double old = gen_.step_s, pace = p_.step_s * factor;
  gen_.slowdown = factor;
  if (watch_.on) {
    // Watched while a node of the job is slow in its compute, and a little after.
    if (SlowVisible()) {
      watch_.until = -1;
    } else if (watch_.until < 0) {
      watch_.until = StepAt(now) + kAfter;
    }
  }
  if (gen_.first == kNever || gen_.frozen != kNever || now < gen_.seg_t) {
    // Not stepping (launching, stopped, or in a save's blocking): the next
    // segment runs at the new pace.
    gen_.step_s = pace;
    if (gen_.first != kNever && gen_.frozen == kNever) ScheduleCheckpointEvent();
    return;
  }
  const double done = ToSec(now - gen_.seg_t) / old;
  const auto whole = static_cast<std::int64_t>(std::floor(done));
  if (gen_.seg_step + whole >= gen_.save_step) {
    // Waiting at the save: its blocking ends as scheduled; the steps after it run at the new pace.
    gen_.seg_done = StepTime(gen_.save_step);
    gen_.seg_step = gen_.save_step;
    gen_.seg_t = now;
    gen_.step_s = pace;
    return;
  }
  if (whole > 0) {
    gen_.seg_done = StepTime(gen_.seg_step + whole);
    gen_.seg_step += whole;
  }
  // The step under way keeps the share of it done.
  gen_.step_s = pace;
  gen_.seg_t = now - Sec((done - static_cast<double>(whole)) * pace);
  ScheduleCheckpointEvent();
}

void Simulation::Watch(Nanos now) {
  if (gen_.first == kNever || now < gen_.first || gen_.frozen != kNever) return;
  if (watch_.on && watch_.generation == gen_.g) {
    watch_.until = -1;
    return;
  }
  const int pending = watch_.pending;
  const std::int64_t step = StepAt(now);
  std::int64_t from = std::max(gen_.first_no, step - kBackfill + 1);
  if (watch_.generation == gen_.g) {
    // Watched before in this generation: the peers stay, and no step is sent twice.
    std::int64_t sent = -1;
    for (const auto& [slot, to] : watch_.sent_to) sent = std::max(sent, to);
    from = std::max(from, sent + 1);
  } else {
    watch_ = Watching{};
    watch_.generation = gen_.g;
    watch_.pending = pending;
    std::vector<int> slots;
    for (int s = 0; s < nnodes_; ++s) slots.push_back(s);
    for (int i = 0; i < kPeers && i < nnodes_; ++i) {
      std::swap(slots[i], slots[i + static_cast<int>(std::uniform_real_distribution<double>(0.0, 1.0)(slow_rng_) *
                                                    (nnodes_ - i)) % (nnodes_ - i)]);
      watch_.peers.push_back(slots[i]);
    }
  }
  watch_.on = true;
  watch_.paused = false;
  watch_.from = from;
  watch_.until = -1;
  for (int slot : watch_.peers) {
    auto [it, added] = watch_.sent_to.emplace(slot, from - 1);
    it->second = std::max(it->second, from - 1);
  }
  Schedule(now + Sec(kTimingsEvery * gen_.step_s), Ev::kTimings, -1, gen_.g);
}

void Simulation::SendTimings(Nanos now, int also_slot) {
  const std::int64_t newest = StepAt(now);
  // The watched: the healthy sample and every slow node of the job.
  std::vector<int> slots = watch_.peers;
  for (int extra : {also_slot, watch_.pending}) {
    if (extra >= 0 && std::find(slots.begin(), slots.end(), extra) == slots.end()) slots.push_back(extra);
  }
  for (int node : slow_nodes_) {
    if (InJob(node) && std::find(slots.begin(), slots.end(), nodes_[node].group_rank) == slots.end()) {
      slots.push_back(nodes_[node].group_rank);
    }
  }
  const double step_us = gen_.step_s * 1e6, healthy_us = p_.step_s * 1e6;
  for (int slot : slots) {
    const int node = slot < static_cast<int>(slot_node_.size()) ? slot_node_[slot] : -1;
    if (node < 0 || !InJob(node)) continue;
    auto [it, added] = watch_.sent_to.emplace(slot, watch_.from - 1);
    const std::int64_t first = it->second + 1;
    if (first > newest) continue;
    it->second = newest;
    const Node& n = nodes_[node];
    // Its compute: 60 % of a healthy step, and the whole of its slowdown when
    // it shows there; its collectives: the rest of the job's step (the wait
    // for the slowest included). Noise: 3 % common to every node at a step,
    // 2 % of its own.
    const double extra_us = n.slow_visible ? (n.slow - 1) * healthy_us : 0;
    scratch_.Clear();
    auto* t = scratch_.mutable_timings();
    t->set_generation(gen_.g);
    for (const char* name : {"forward", "backward", "optimizer", "all_reduce"}) t->add_names(name);
    const int rank = slot * nproc_;
    for (std::int64_t s = first; s <= newest; ++s) {
      const double common = std::exp(0.03 * Noise(gen_.g, s, -1));
      const double own = std::exp(0.02 * Noise(gen_.g, s, rank));
      const double step = step_us * common;
      const double compute = std::min(step, (0.6 * healthy_us + extra_us) * common * own);
      auto* st = t->add_steps();
      st->set_global_rank(rank);
      st->set_step(s);
      st->set_start_unix_us(Wall(StepTime(s)) / 1000 - static_cast<std::int64_t>(step));
      st->set_duration_us(static_cast<std::int64_t>(step));
      std::int64_t at = 0;
      for (auto [name, share] : {std::pair{0, 0.35}, {1, 0.55}, {2, 0.10}}) {
        auto* pi = st->add_intervals();
        pi->set_name(name);
        pi->set_kind(1);
        pi->set_start_us(at);
        pi->set_duration_us(static_cast<std::int64_t>(compute * share));
        at += pi->duration_us();
      }
      auto* ar = st->add_intervals();
      ar->set_name(3);
      ar->set_kind(10);
      ar->set_start_us(at);
      ar->set_duration_us(std::max<std::int64_t>(0, static_cast<std::int64_t>(step) - at));
      ar->set_group_id(0);
      ar->set_seq(s);
      ar->set_peer(-1);
    }
    Deliver(node, std::move(scratch_));
  }
}

bool Simulation::SlowVisible() const {
  for (int node : slow_nodes_) {
    if (InJob(node) && nodes_[node].slow_visible) return true;
  }
  return false;
}

bool Simulation::SlowUnnamed() const {
  for (int node : slow_nodes_) {
    if (InJob(node) && nodes_[node].slow_visible && !recorded_.named.count(nodes_[node].id)) return true;
  }
  return false;
}

void Simulation::TimingsDue(std::int64_t generation) {
  const Nanos now = clock_.MonotonicNanos();
  if (generation != gen_.g || watch_.generation != gen_.g || !watch_.on) return;
  if (gen_.frozen <= now) {
    watch_.on = false;
    return;
  }
  SendTimings(now);
  if (watch_.until >= 0 && StepAt(now) >= watch_.until) {
    watch_.on = false;
    return;
  }
  if (watch_.until < 0 && p_.straggler_action == "report" && !SlowUnnamed() && gen_.slowdown > 1) {
    // Every slow node is named: the detector has done its part until one recovers.
    watch_.on = false;
    watch_.paused = true;
    return;
  }
  Schedule(now + Sec(kTimingsEvery * gen_.step_s), Ev::kTimings, -1, generation);
}

void Simulation::ScheduleCheckpointEvent() {
  ++gen_.save_token;
  Schedule(StepTime(gen_.save_step) + Sec(p_.checkpoint_blocked_s), Ev::kCheckpoint, gen_.save_token, gen_.g);
}

}  // namespace trainguard::sim_detail

namespace trainguard::sim_detail {

void Simulation::TallyStragglers() {
  // A naming is of the slowdown of its node that was under way then (or
  // ended within the detector's clearing margin); the first naming of each
  // counts for how soon.
  result_.stragglers_named = static_cast<int>(recorded_.stragglers.size());
  const Nanos wall0 = Wall(start_mono_);
  for (const Event& e : recorded_.stragglers) {
    const double at = ToSec(e.wall_ns - wall0);
    SimSlowdown* of = nullptr;
    for (auto& s : result_.slowdown_list) {
      if (s.node == e.node && s.start_s <= at && at <= s.end_s + 3600) of = &s;
    }
    if (of == nullptr) {
      ++result_.named_wrongly;
      continue;
    }
    if (of->named_s < 0) of->named_s = at - of->start_s;
  }
}

}  // namespace trainguard::sim_detail
