#include "controller/replica_check.h"

#include <algorithm>

namespace trainguard {

void ReplicaCheck::Reset(int world_size) {
  world_size_ = std::max(world_size, 0);
  kept_.assign(static_cast<std::size_t>(world_size_), {});
  learn_checked_ = -1;
  learn_steps_ = 0;
  any_ = false;
  candidate_.clear();
  sets_.clear();
  checks_.clear();
}

void ReplicaCheck::Add(int rank, std::int64_t step, std::uint64_t value) {
  if (rank < 0 || rank >= world_size_ || step < 0) return;
  auto& kept = kept_[static_cast<std::size_t>(rank)];
  if (!kept.empty() && step <= kept.back().first) return;  // replayed or out of order
  kept.push_back({step, value});
  any_ = true;
  while (kept.size() > kKeep) kept.pop_front();
}

std::optional<std::uint64_t> ReplicaCheck::ValueAt(int rank, std::int64_t step) const {
  for (const auto& [s, v] : kept_[static_cast<std::size_t>(rank)]) {
    if (s == step) return v;
  }
  return std::nullopt;
}

std::vector<std::int64_t> ReplicaCheck::CommonSteps(const std::vector<int>& ranks, std::int64_t after) const {
  std::vector<std::int64_t> steps;
  if (ranks.empty()) return steps;
  for (const auto& [s, v] : kept_[static_cast<std::size_t>(ranks[0])]) {
    if (s <= after) continue;
    bool all = true;
    for (int r : ranks) all = all && ValueAt(r, s).has_value();
    if (all) steps.push_back(s);
  }
  return steps;
}

void ReplicaCheck::Learn() {
  if (!sets_.empty() || world_size_ < 2) return;
  std::vector<int> everyone(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) everyone[static_cast<std::size_t>(r)] = r;
  for (std::int64_t step : CommonSteps(everyone, learn_checked_)) {
    learn_checked_ = step;
    ++learn_steps_;
    std::map<std::uint64_t, std::vector<int>> by_value;
    for (int r : everyone) by_value[*ValueAt(r, step)].push_back(r);
    std::vector<std::vector<int>> groups;
    for (auto& [v, ranks] : by_value) {
      if (ranks.size() >= 2) groups.push_back(ranks);
    }
    std::sort(groups.begin(), groups.end());
    if (!groups.empty() && groups == candidate_) {  // the same sets at two checked steps: replicas
      sets_ = groups;
      for (const auto& g : sets_) checks_.push_back(Set{g, step, step, false});
      return;
    }
    candidate_ = groups;
  }
}

bool ReplicaCheck::Restore(const std::vector<std::vector<int>>& sets, std::int64_t agreed_through) {
  if (sets.empty()) return false;
  for (const auto& set : sets) {
    if (set.size() < 2) return false;
    for (int r : set) {
      if (r < 0 || r >= world_size_) return false;
    }
  }
  sets_ = sets;
  checks_.clear();
  for (const auto& g : sets_) checks_.push_back(Set{g, agreed_through, agreed_through, false});
  return true;
}

std::int64_t ReplicaCheck::AgreedThrough() const {
  if (checks_.empty()) return !any_ || learn_steps_ >= kLearnSteps ? kNoReplicas : kUnknown;
  std::int64_t through = kNoReplicas;
  for (const Set& s : checks_) through = std::min(through, s.last_agreed);
  return through;
}

std::vector<Divergence> ReplicaCheck::Evaluate() {
  Learn();
  std::vector<Divergence> found;
  for (Set& set : checks_) {
    if (set.reported) continue;
    for (std::int64_t step : CommonSteps(set.members, set.checked)) {
      set.checked = step;
      std::map<std::uint64_t, std::vector<int>> by_value;
      for (int r : set.members) by_value[*ValueAt(r, step)].push_back(r);
      if (by_value.size() == 1) {
        set.last_agreed = step;
        continue;
      }
      Divergence d;
      d.step = step;
      d.last_agreed_step = set.last_agreed;
      d.replicas = set.members;
      for (int r : set.members) d.values[r] = *ValueAt(r, step);
      for (const auto& [v, ranks] : by_value) {
        if (ranks.size() * 2 > set.members.size()) {  // a strict majority: the others diverged
          for (int r : set.members) {
            if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) d.diverged.push_back(r);
          }
        }
      }
      set.reported = true;
      found.push_back(std::move(d));
      break;
    }
  }
  return found;
}

}  // namespace trainguard
