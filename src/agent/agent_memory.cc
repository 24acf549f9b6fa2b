// Agent: node memory copies of checkpoints (docs/restart.md). The node's
// MemoryStore, the server other nodes push to and fetch from, the push of
// each committed copy of this node's ranks to its peer (a thread of its own,
// never the control loop), and the fetch of a returning node's copies
// before its ranks start.
#include <algorithm>
#include <cstdio>

#include "agent/agent_memory.h"
#include "agent/agent_rank.h"
#include "common/status_page.h"

namespace trainguard {

namespace {
// Often enough that the peer lags the newest commit by less than one save
// even when saves come every few tenths of a second: the node keeps the
// step before its newest only (checkpoint_engine.cc), and a restore needs a
// step every rank holds. A scan reads each rank's status page: atomics.
constexpr Nanos kPushScanInterval = 100 * kMillisecond;
}  // namespace

void Agent::StartMemoryServer() {
  memory_ = std::make_unique<MemoryCopies>(config_);
  if (Status s = memory_->server.Start(config_.address); !s.ok()) {
    std::fprintf(stderr, "trainguard agent %s: warning: %s; this node keeps no other node's checkpoint copies\n",
                 config_.node_id.c_str(), s.message().c_str());
  }
}

int Agent::MemoryPort() const { return memory_ != nullptr ? memory_->server.port() : 0; }

std::string Agent::MemoryRoot(const v1::Start& start) const {
  if (memory_ == nullptr || start.memory_checkpoints() <= 0) return "";
  Status s = memory_->store.Open("trainguard-" + start.run_id() + "-" + config_.node_id + "-" +
                                 std::to_string(getpid()) + "-checkpoints");
  if (!s.ok()) {
    std::fprintf(stderr, "trainguard agent %s: %s; checkpoints are restored from storage only\n",
                 config_.node_id.c_str(), s.message().c_str());
    return "";
  }
  if (!memory_->said_root) {
    memory_->said_root = true;
    std::fprintf(stderr, "trainguard agent %s: node memory copies of checkpoints in %s\n", config_.node_id.c_str(),
                 memory_->store.Describe().c_str());
  }
  return memory_->store.Root();
}

void Agent::PrepareMemoryCopies(const v1::Start& start, v1::RanksStarted* started) {
  if (memory_ == nullptr) return;
  memory_->peer = start.memory_checkpoints() > 0 ? start.memory_peer() : "";
  memory_->keep = std::max(start.memory_checkpoints(), 1);
  memory_->pushed_step.clear();
  if (start.memory_checkpoints() > 0 && start.nnodes() > 1 && start.group_rank() >= 0) {
    const int previous = (start.group_rank() + start.nnodes() - 1) % start.nnodes();  // whose copies come here
    memory_->server.Accept(previous * start.nproc_per_node(), start.nproc_per_node(), memory_->keep);
  }
  if (start.memory_restore_from().empty() || memory_->store.Root().empty()) return;
  std::vector<int> ranks;
  for (int local = 0; local < start.nproc_per_node(); ++local) {
    ranks.push_back(start.group_rank() * start.nproc_per_node() + local);
  }
  // A node that still holds copies of its ranks (its ranks restarted, the
  // agent did not) has them at least as new as any peer: the peer gets them
  // only once committed.
  if (memory_->store.HasOwnCopyOf(ranks)) return;
  v1::MemoryRestore* restore = started->mutable_memory_restore();
  restore->set_from_node(start.memory_restore_node());
  const Nanos t0 = clock_->MonotonicNanos();
  auto fetched = FetchCopies(start.memory_restore_from(), ranks, &memory_->store, config_.job_secret, kMemoryCopyTimeout);
  restore->set_ms(static_cast<double>(clock_->MonotonicNanos() - t0) / kMillisecond);
  if (!fetched.ok()) {
    restore->set_problem(fetched.status().message());
    std::fprintf(stderr, "trainguard agent %s: no checkpoint copies fetched from %s's memory: %s\n",
                 config_.node_id.c_str(), start.memory_restore_node().c_str(), fetched.status().message().c_str());
    return;
  }
  restore->set_files(fetched->files);
  restore->set_bytes(fetched->bytes);
  std::fprintf(stderr, "trainguard agent %s: fetched %d checkpoint copies (%lld bytes) from %s's memory in %.0f ms\n",
               config_.node_id.c_str(), fetched->files, static_cast<long long>(fetched->bytes),
               start.memory_restore_node().c_str(), restore->ms());
}

void Agent::MaybePushMemoryCopies() {
  if (memory_ == nullptr || memory_->peer.empty()) return;
  const Nanos now = clock_->MonotonicNanos();
  if (now < memory_->next_scan) return;
  memory_->next_scan = now + kPushScanInterval;
  // The newest step every rank of this node has committed, pushed for all of
  // them together: the peer then holds the same step of each (a restore
  // needs one step every rank holds), not each rank's newest at the moment
  // of the scan. Ranks that never committed (no checkpoints) do not hold it back.
  std::int64_t step = INT64_MAX;
  for (const auto& rank : ranks_) {
    if (rank->page.get() == nullptr) continue;
    const std::int64_t committed = rank->page.get()->checkpoint_step.load(std::memory_order_relaxed);
    if (committed != kNoStep) step = std::min(step, committed);
  }
  if (step == INT64_MAX) return;
  for (const auto& rank : ranks_) {
    if (rank->page.get() == nullptr) continue;
    auto pushed = memory_->pushed_step.find(rank->global_rank);
    if (pushed != memory_->pushed_step.end() && step <= pushed->second) continue;
    // Committed: the copy was written before the rank's manifest, so it is whole and named.
    memory_->pushed_step[rank->global_rank] = step;
    for (const auto& relative : memory_->store.OwnCopies(rank->global_rank, step)) {
      memory_->Push(memory_->peer, relative, memory_->keep);
    }
  }
}

std::int64_t Agent::MemoryCopyBytes() const { return memory_ != nullptr ? memory_->store.Bytes() : 0; }

void Agent::DropMemoryCheckpoints() { memory_.reset(); }

}  // namespace trainguard
