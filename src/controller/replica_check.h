// ReplicaCheck: finds a rank whose parameters silently diverged from its
// data-parallel replicas' (docs/sdc.md). Each rank reports fingerprints of
// its parameters after some optimizer steps (the same steps on every rank:
// multiples of a power of two). Which ranks are replicas is learned, not
// assumed: ranks whose fingerprints were equal at two checked steps in a
// row are a replica set (DDP: the whole world; TP x PP x DP: each TP/PP
// coordinate's DP peers; FSDP's shards never agree and are never compared).
// After that, at every step all members of a set reported, a value held by
// a strict majority names the others as diverged; no strict majority (two
// replicas) is a disagreement without a culprit.
//
// Memory: per rank, the newest kKeep fingerprints; per set, the newest
// checked step. Not thread-safe (the controller's thread).
#pragma once

#include <array>
#include <cstdint>
#include <climits>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace trainguard {

// Replica sets as JSON, small at any size: a set that is an arithmetic
// progression of ranks (DDP: the world; TP x PP x DP: each coordinate's DP
// peers) as {"first", "stride", "count"}, any other as its list of ranks.
// (As lists, 100,000 ranks' sets took 590 KB in every generation's event.)
nlohmann::json ReplicaSetJson(const std::vector<int>& set);
nlohmann::json ReplicaSetsJson(const std::vector<std::vector<int>>& sets);
// Reads both forms back; nullopt when malformed (a count over 10,000,000).
std::optional<std::vector<std::vector<int>>> ReplicaSetsFromJson(const nlohmann::json& j);

struct Divergence {
  std::int64_t step = -1;               // the first checked step the set disagreed at
  std::int64_t last_agreed_step = -1;   // the step before it at which the set agreed
  std::vector<int> replicas;            // the set
  std::vector<int> diverged;            // the minority; empty when no value has a strict majority
  std::map<int, std::uint64_t> values;  // each member's fingerprint at `step`
};

class ReplicaCheck {
 public:
  static constexpr std::size_t kKeep = 32;
  explicit ReplicaCheck(int world_size = 0) { Reset(world_size); }
  // A new generation: nothing learned, nothing kept.
  void Reset(int world_size);
  void Add(int rank, std::int64_t step, std::uint64_t value);
  // The divergences found since the last call (each set reports once).
  std::vector<Divergence> Evaluate();
  // A restarted controller's (or a new leader's): the sets its predecessor
  // learned (the replica_sets event), agreed through `agreed_through`; they
  // are compared from the next step on, not learned again. False, and
  // nothing changed, when a set has fewer than two ranks or one outside the
  // world.
  bool Restore(const std::vector<std::vector<int>>& sets, std::int64_t agreed_through);
  // The replica sets learned so far.
  const std::vector<std::vector<int>>& replica_sets() const { return sets_; }
  // Through which step the replicas are known to agree: the lowest of the
  // sets' last agreed steps; kUnknown while learning (fingerprints came, no
  // set yet, fewer than kLearnSteps common steps seen); kNoReplicas when the
  // learning saw that many and found none (or no fingerprints came at all).
  static constexpr std::int64_t kUnknown = -2;
  static constexpr std::int64_t kNoReplicas = INT64_MAX;
  static constexpr int kLearnSteps = 4;
  std::int64_t AgreedThrough() const;
  // A rank's fingerprint at `step`, if kept.
  std::optional<std::uint64_t> ValueAt(int rank, std::int64_t step) const;

 private:
  struct Set {
    std::vector<int> members;
    std::int64_t checked = -1;       // the newest step compared
    std::int64_t last_agreed = -1;
    bool reported = false;
  };
  // The steps every rank in `ranks` has a fingerprint of, above `after`, ascending.
  std::vector<std::int64_t> CommonSteps(const std::vector<int>& ranks, std::int64_t after) const;
  void Learn();

  int world_size_ = 0;
  // A rank's newest kKeep fingerprints, oldest first, in place (no
  // allocation per fingerprint or per generation).
  struct Kept {
    std::array<std::pair<std::int64_t, std::uint64_t>, kKeep> ring;
    std::uint8_t head = 0;  // the oldest
    std::uint8_t size = 0;
    const std::pair<std::int64_t, std::uint64_t>& operator[](std::size_t i) const { return ring[(head + i) % kKeep]; }
  };
  std::vector<Kept> kept_;  // by rank
  // Learning: the partition seen at the newest fully reported step.
  std::int64_t learn_checked_ = -1;
  int learn_steps_ = 0;  // common steps the learning examined
  bool any_ = false;     // a fingerprint came
  std::vector<std::vector<int>> candidate_;  // equal-value groups of size >= 2 at that step
  std::vector<std::vector<int>> sets_;
  std::vector<Set> checks_;
};

}  // namespace trainguard
