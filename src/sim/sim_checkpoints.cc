// trainguard sim: the job's steps and checkpoints (simulation.h) — saves
// that block the ranks, each to node memory (pushed on to the peer node's)
// and, at the storage tier's interval, to storage; the point a new
// generation restores from, and how long reading it back takes.
//
// A failure is restored from memory: a rank's own node's copy when every
// node survived, the peers' copies when a node was lost (a push under way
// then never ended), storage when a node and its peer were both lost, when
// there is no memory tier, or to roll back past silent corruption.
#include <algorithm>

#include "sim/simulation.h"

namespace trainguard::sim_detail {

namespace {
constexpr std::size_t kStorageSavesKept = 4096;  // enough to roll back past any corruption latency
}  // namespace

void Simulation::NodeLost(int group_rank) {
  if (group_rank >= 0) lost_slots_.insert(group_rank);
  ckpt_.last_node_loss = clock_.MonotonicNanos();
}

void Simulation::StartSteps(std::int64_t g, Nanos launched, Nanos now) {
  // Node s pushes its copies to node s + 1: both lost, s's shards are only in storage.
  bool both_lost = false;
  for (int s : lost_slots_) both_lost = both_lost || lost_slots_.count((s + 1) % nnodes_) > 0;
  std::int64_t from = -1;
  std::int64_t stored = -1;  // with a rollback bound: storage's newest save within it
  bool from_storage = true;
  if (g == 0) {
    from = -1;
  } else if (resume_at_most_ >= 0) {
    // The controller's bound after replicas diverged: the newest save no
    // newer, from storage, the nodes' memory (the newest two) or, for a lost
    // node, its peer's.
    for (const auto& [at, step] : ckpt_.storage_saves) {
      if (step <= resume_at_most_) stored = std::max(stored, step);
    }
    std::int64_t memory = -1;
    if (MemoryTier() && lost_slots_.empty()) {
      for (std::int64_t step : {ckpt_.local, ckpt_.local_prev}) {
        if (step <= resume_at_most_) memory = std::max(memory, step);
      }
    } else if (MemoryTier() && !both_lost && ckpt_.peer <= resume_at_most_) {
      memory = ckpt_.peer;
    }
    from_storage = memory < stored;
    from = std::max(stored, memory);
  } else if (sdc_since_ >= 0) {
    // The memory copies were saved after the corruption began: storage's
    // newest save from before it.
    for (const auto& [at, step] : ckpt_.storage_saves) {
      if (at < sdc_since_) from = step;
    }
  } else if (!MemoryTier() || both_lost) {
    from = ckpt_.storage;
  } else {
    from = std::max(ckpt_.storage, lost_slots_.empty() ? ckpt_.local : ckpt_.peer);
    from_storage = from == ckpt_.storage && from != (lost_slots_.empty() ? ckpt_.local : ckpt_.peer);
  }
  if (g > 0 && from_storage) ++storage_restores_;
  lost_slots_.clear();
  // The new generation's saves replace whatever the failed one left past its restore point.
  if (g > 0) {
    ckpt_.local = ckpt_.peer = from;
    ckpt_.local_prev = -1;
    if (resume_at_most_ >= 0) {  // saves past the bound are set aside
      ckpt_.storage = stored;
      while (!ckpt_.storage_saves.empty() && ckpt_.storage_saves.back().second > from) ckpt_.storage_saves.pop_back();
    } else if (sdc_since_ >= 0) {  // saves from the corruption on are corrupt, in storage too
      ckpt_.storage = from;
      while (!ckpt_.storage_saves.empty() && ckpt_.storage_saves.back().first >= sdc_since_) {
        ckpt_.storage_saves.pop_back();
      }
    }
  }
  CountSlowed(now);  // the generation that ends
  gen_ = Gen{};
  gen_.g = g;
  gen_.step_s = p_.step_s;
  gen_.launched = launched;
  gen_.restored = from;
  const double restore_s = g == 0 || from < 0 ? 0 : from_storage ? p_.restore_storage_s : p_.restore_memory_s;
  gen_.first = now + Sec(p_.LaunchS(nnodes_) + restore_s);
  gen_.first_no = from + 1;
  gen_.seg_step = gen_.first_no;
  gen_.seg_done = gen_.seg_t = gen_.first;
  ScheduleSave();
}

void Simulation::ScheduleSave() {
  const double every = MemoryTier() ? memory_every_s_ : storage_every_s_;
  const std::int64_t k = std::max<std::int64_t>(1, std::llround(every / p_.step_s));
  gen_.save_step = gen_.seg_step + k;
  ScheduleCheckpointEvent();
}

void Simulation::Save(Nanos now) {
  const std::int64_t n = gen_.save_step;
  bool to_storage = !MemoryTier() ||
                    static_cast<double>(n - ckpt_.last_storage_save) * p_.step_s >= storage_every_s_ - p_.step_s / 2;
  Nanos wait = 0;
  if (to_storage && ckpt_.persist_until > now) {
    // The previous write to storage has not ended: with a memory tier this
    // save stays in memory; without one it waits for the write.
    if (MemoryTier()) {
      to_storage = false;
    } else {
      wait = ckpt_.persist_until - now;
    }
  }
  ++gen_.saves;
  ++result_.saves;
  gen_.blocked += Sec(p_.checkpoint_blocked_s) + wait;
  gen_.seg_done = StepTime(n);
  gen_.seg_step = n;
  gen_.seg_t = now + wait;
  if (MemoryTier()) {
    ckpt_.local_prev = ckpt_.local;
    ckpt_.local = n;
    Schedule(gen_.seg_t + Sec(p_.peer_copy_s), Ev::kPeerCopied, static_cast<int>(gen_.g), n);
  }
  if (to_storage) {
    ckpt_.last_storage_save = n;
    ckpt_.persist_until = gen_.seg_t + Sec(p_.persist_s);
    Schedule(ckpt_.persist_until, Ev::kPersisted, static_cast<int>(gen_.g), n);
  }
  ScheduleSave();
}

void Simulation::SavedToPeer(Nanos at, std::int64_t step) {
  // A node lost while its push ran: that node's shards never reached its peer.
  if (ckpt_.last_node_loss >= at - Sec(p_.peer_copy_s)) return;
  ckpt_.peer = std::max(ckpt_.peer, step);
}

void Simulation::SavedToStorage(Nanos at, std::int64_t generation, std::int64_t step) {
  // The ranks write it: stopped or crashed before the end, it is not whole.
  if (generation != gen_.g || gen_.frozen <= at) return;
  ckpt_.storage = std::max(ckpt_.storage, step);
  ckpt_.storage_saves.emplace_back(at - Sec(p_.persist_s), step);
  if (ckpt_.storage_saves.size() > kStorageSavesKept) ckpt_.storage_saves.pop_front();
}

void Simulation::SaveEverywhere(std::int64_t step, Nanos now) {
  ckpt_.local = ckpt_.peer = ckpt_.storage = std::max(ckpt_.storage, step);
  ckpt_.storage_saves.emplace_back(now, ckpt_.storage);
  if (ckpt_.storage_saves.size() > kStorageSavesKept) ckpt_.storage_saves.pop_front();
}

void Simulation::ApplyPlan(const v1::CheckpointPlan& plan) {
  result_.plan = plan.basis();
  if (p_.checkpoint_policy != "auto") return;  // the script's own intervals: the plan is only reported
  memory_every_s_ = static_cast<double>(plan.memory_interval_ms()) / 1000;
  storage_every_s_ = std::max(p_.step_s, static_cast<double>(plan.storage_interval_ms()) / 1000);
}

}  // namespace trainguard::sim_detail
