// trainguard sim: failures — the next one drawn from the failure model, a
// node struck (a crash, a hang, a lost host, silent corruption, planned
// maintenance) and a generation frozen (simulation.h).
#include <algorithm>

#include "sim/simulation.h"

namespace trainguard::sim_detail {

void Simulation::ScheduleNextFault() {
  // Faults strike the job's nodes and its idle spares alike: a bad node
  // `multiplier` times as often.
  double weight = (nnodes_ + p_.spares) * (1 + model_.bad_node_fraction * (model_.bad_node_multiplier - 1));
  double per_s = model_.PerNodeDay() * weight / 86400.0;
  double wait = -std::log(1.0 - Uniform()) / per_s;
  Schedule(clock_.MonotonicNanos() + Sec(wait), Ev::kFault);
}

int Simulation::IdleSpare(int k) const {
  // Rare (a fault drawn on a spare's place): a pass over the nodes.
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    const Node& n = nodes_[i];
    if (!n.gone && n.in_session && n.group_rank < 0 && k-- == 0) return i;
  }
  return -1;
}

int Simulation::PickNode() {
  // A place at random (the job's slots, then the spares'), bad nodes
  // weighted up (rejection sampling).
  const int places = nnodes_ + p_.spares;
  for (int tries = 0; tries < 1000; ++tries) {
    const int k = static_cast<int>(Uniform() * places);
    const int candidate = k >= nnodes_                                  ? IdleSpare(k - nnodes_)
                          : k < static_cast<int>(slot_node_.size()) ? slot_node_[k]
                                                                    : -1;
    if (candidate < 0) continue;
    double w = nodes_[candidate].bad ? model_.bad_node_multiplier : 1.0;
    if (Uniform() * model_.bad_node_multiplier <= w) return candidate;
  }
  return -1;
}

void Simulation::Inject(int category) {
  const FailureCategory& c = model_.categories[category];
  const int node = PickNode();
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
  const bool spare = n.group_rank < 0;  // never started: an idle spare
  if (spare) ++result_.faults_on_spares;
  if (Uniform() < c.persistent && signal != FailureSignal::kPlanned) {
    n.broken = category;
    n.broken_signal = signal;
    if (spare && signal != FailureSignal::kNodeDown) ++result_.spares_broken;
  }
  if (spare) {
    // Its host lost (or drained for maintenance) it goes away; anything
    // else hits no rank. A persistent fault waits for its promotion.
    if (signal == FailureSignal::kPlanned) n.planned = true;
    if (signal == FailureSignal::kNodeDown || signal == FailureSignal::kPlanned) {
      Strike(node, category, FailureSignal::kNodeDown);
    }
    return;
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
    // gRPC's keepalive (a ping every 10 s, 20 s for its answer) closes the
    // session of a host that went silent: how the controller learns of an
    // idle spare's loss, or of a job node's while no generation runs.
    Schedule(now + Sec(30), Ev::kDisconnect, node);
    if (opt_.trace != nullptr) {
      SimTraceEntry t;
      t.kind = SimTraceEntry::kDown;
      t.at = now - start_mono_;
      t.node = node;
      opt_.trace->push_back(std::move(t));
    }
    if (n.group_rank < 0) {  // an idle spare: no copy or rank of the job is hit
      ++result_.spares_lost;
      return;
    }
    NodeLost(n.group_rank);
    fault_outstanding_ = true;
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
    // A defect that stays (a stuck-at fault, a "mercurial" core) corrupts
    // every step, the optimizer's included: its rank's parameters leave its
    // replicas', and its next fingerprint shows it. A single upset in the
    // forward or backward pass is summed into every replica by the
    // gradients' all-reduce: it shows only as a NaN loss, later.
    if (n.broken == category && Fingerprinted()) {
      if (n.sdc_local < 0) n.sdc_local = static_cast<int>(Uniform() * nproc_);
      if (sdc_rank_ >= 0) return;  // one diverged rank at a time: the first is found
      sdc_rank_ = n.group_rank * nproc_ + n.sdc_local;
      sdc_step_ = StepAt(now) + 1;
      sdc_category_ = category;
      const std::int64_t k = p_.fingerprint_every;
      const std::int64_t taken = (sdc_step_ + k - 1) / k * k;
      Schedule(StepTime(taken) + Sec(p_.heartbeat_interval_s), Ev::kSdcShows, -1, gen_.g);
      return;
    }
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
