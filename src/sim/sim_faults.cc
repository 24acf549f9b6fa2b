// trainguard sim: failures — the next one drawn from the failure model, a
// node struck (a crash, a hang, a lost host, silent corruption, planned
// maintenance) and a generation frozen (simulation.h).
#include <algorithm>

#include "sim/simulation.h"

namespace trainguard::sim_detail {

void Simulation::ScheduleNextFault() {
  // Faults strike the job's nodes: a bad node `multiplier` times as often.
  double weight = nnodes_ * (1 + model_.bad_node_fraction * (model_.bad_node_multiplier - 1));
  double per_s = model_.PerNodeDay() * weight / 86400.0;
  double wait = -std::log(1.0 - Uniform()) / per_s;
  Schedule(clock_.MonotonicNanos() + Sec(wait), Ev::kFault);
}

void Simulation::Inject(int category) {
  const FailureCategory& c = model_.categories[category];
  // The node: a slot at random, bad nodes weighted up (rejection sampling).
  int node = -1;
  for (int tries = 0; tries < 1000 && node < 0; ++tries) {
    int slot = static_cast<int>(Uniform() * nnodes_);
    int candidate = slot < static_cast<int>(slot_node_.size()) ? slot_node_[slot] : -1;
    if (candidate < 0) continue;
    double w = nodes_[candidate].bad ? model_.bad_node_multiplier : 1.0;
    if (Uniform() * model_.bad_node_multiplier <= w) node = candidate;
  }
  if (node < 0) return;
  double u = Uniform(), acc = 0;
  FailureSignal signal = c.signals.back().first;
  for (const auto& [s, w] : c.signals) {
    acc += w;
    if (u < acc) {
      signal = s;
      break;
    }
  }
  ++result_.faults;
  ++result_.categories[category].injected;
  Node& n = nodes_[node];
  if (!n.alive) return;  // it is already down
  if (Uniform() < c.persistent && signal != FailureSignal::kPlanned) {
    n.broken = category;
    n.broken_signal = signal;
  }
  Strike(node, category, signal);
}

void Simulation::Freeze(Nanos at) {
  if (gen_.frozen == kNever) gen_.frozen = at;
}

void Simulation::Strike(int node, int category, FailureSignal signal) {
  Node& n = nodes_[node];
  const Nanos now = clock_.MonotonicNanos();
  const bool running = n.ranks_running && n.generation == gen_.g && gen_.frozen == kNever;
  n.struck = category;
  if (signal == FailureSignal::kNodeDown) {
    // A real agent's last heartbeat left at most an interval before: the
    // step the job failed at is known (lost work counts from it).
    if (running) Report(node);
    if (running && !gen_cause_.count(gen_.g)) gen_cause_[gen_.g] = category;
    if (running) Freeze(now);
    n.alive = false;
    n.heard_until = now;
    SetHeard(node);
    n.down_category = category;
    NodeLost(n.group_rank);
    fault_outstanding_ = true;
    if (opt_.trace != nullptr) {
      SimTraceEntry t;
      t.kind = SimTraceEntry::kDown;
      t.at = now - start_mono_;
      t.node = node;
      opt_.trace->push_back(std::move(t));
    }
    // A rack, switch or power event takes the peer (the node its copies go to) along.
    if (!striking_peer_ && n.group_rank >= 0 && nnodes_ > 1 && Uniform() < p_.peer_loss_fraction) {
      const int slot = (n.group_rank + 1) % nnodes_;
      const int peer = slot < static_cast<int>(slot_node_.size()) ? slot_node_[slot] : -1;
      if (peer >= 0 && nodes_[peer].alive) {
        striking_peer_ = true;
        ++result_.categories[category].injected;
        Strike(peer, category, FailureSignal::kNodeDown);
        striking_peer_ = false;
      }
    }
    return;
  }
  if (signal == FailureSignal::kPlanned) {
    if (!running) return;
    // The job saves first (planned), then the host leaves.
    SaveEverywhere(StepAt(now), now);
    Report(node);
    Schedule(now + Sec(1), Ev::kPlannedDown, node, category);
    return;
  }
  if (!running) {
    ++result_.faults_while_down;
    return;
  }
  if (signal == FailureSignal::kSdc) {
    if (sdc_since_ < 0) sdc_since_ = now;
    Schedule(now + Sec(model_.categories[category].latency_hours * 3600), Ev::kSdcNan, node, category);
    return;
  }
  if (!gen_cause_.count(gen_.g)) gen_cause_[gen_.g] = category;
  fault_outstanding_ = true;
  Freeze(now);
  if (signal == FailureSignal::kHang) {
    gen_.hung = true;
    gen_.hang_rank = n.group_rank * nproc_ + static_cast<int>(Uniform() * nproc_);
    Schedule(now + Sec(p_.heartbeat_interval_s), Ev::kHangReport, -1, gen_.g);
    return;
  }
  Crash(node, category);
}

void Simulation::Crash(int node, int category) {
  const FailureCategory& c = model_.categories[category];
  const Nanos now = clock_.MonotonicNanos();
  scratch_.Clear();
  auto* ex = scratch_.mutable_rank_exited();
  ex->set_generation(nodes_[node].generation);
  google::protobuf::RepeatedPtrField<v1::RankStatus> ranks;
  FillRanks(node, now, &ranks, false);
  *ex->mutable_rank() = ranks.Get(static_cast<int>(Uniform() * nproc_));
  ex->mutable_rank()->set_running(false);
  ex->mutable_rank()->set_exit_code(c.signal != 0 ? 0 : c.exit_code);
  ex->mutable_rank()->set_term_signal(c.signal);
  for (const auto& l : c.log_tail) ex->add_log_tail(l);
  for (const auto& l : c.kernel_lines) ex->add_kernel_lines(l);
  ex->set_exit_unix_ms(Wall(now) / kMillisecond);
  Deliver(node, std::move(scratch_));
}


}  // namespace trainguard::sim_detail
