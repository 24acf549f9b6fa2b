#include "controller/replica_check.h"

#include <algorithm>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace trainguard {

using nlohmann::json;

json ReplicaSetJson(const std::vector<int>& set) {
  bool progression = set.size() >= 2 && set[1] > set[0];
  for (std::size_t i = 2; progression && i < set.size(); ++i) progression = set[i] - set[i - 1] == set[1] - set[0];
  if (!progression) return set;
  return {{"first", set[0]}, {"stride", set[1] - set[0]}, {"count", set.size()}};
}

json ReplicaSetsJson(const std::vector<std::vector<int>>& sets) {
  json out = json::array();
  for (const auto& set : sets) out.push_back(ReplicaSetJson(set));
  return out;
}

std::optional<std::vector<std::vector<int>>> ReplicaSetsFromJson(const json& j) {
  constexpr std::int64_t kMaxRanks = 10'000'000;
  if (!j.is_array()) return std::nullopt;
  std::vector<std::vector<int>> sets;
  for (const json& s : j) {
    std::vector<int> set;
    if (s.is_array()) {
      for (const json& r : s) {
        if (!r.is_number_integer()) return std::nullopt;
        set.push_back(r.get<int>());
      }
    } else if (s.is_object()) {
      const json first = s.value("first", json()), stride = s.value("stride", json()), count = s.value("count", json());
      if (!first.is_number_integer() || !stride.is_number_integer() || !count.is_number_integer()) return std::nullopt;
      const std::int64_t n = count.get<std::int64_t>(), a = first.get<std::int64_t>(), d = stride.get<std::int64_t>();
      if (n < 0 || n > kMaxRanks || a < 0 || d < 1 || a + d * std::max<std::int64_t>(n - 1, 0) >= kMaxRanks) {
        return std::nullopt;
      }
      for (std::int64_t i = 0; i < n; ++i) set.push_back(static_cast<int>(a + d * i));
    } else {
      return std::nullopt;
    }
    sets.push_back(std::move(set));
  }
  return sets;
}

void ReplicaCheck::Reset(int world_size) {
  world_size_ = std::max(world_size, 0);
  kept_.resize(static_cast<std::size_t>(world_size_));
  for (Kept& k : kept_) k.head = k.size = 0;
  learn_checked_ = -1;
  learn_steps_ = 0;
  any_ = false;
  candidate_.clear();
  sets_.clear();
  checks_.clear();
}

void ReplicaCheck::Add(int rank, std::int64_t step, std::uint64_t value) {
  if (rank < 0 || rank >= world_size_ || step < 0) return;
  Kept& kept = kept_[static_cast<std::size_t>(rank)];
  if (kept.size > 0 && step <= kept[kept.size - 1].first) return;  // replayed or out of order
  any_ = true;
  if (kept.size < kKeep) {
    kept.ring[(kept.head + kept.size++) % kKeep] = {step, value};
  } else {  // the oldest goes
    kept.ring[kept.head] = {step, value};
    kept.head = static_cast<std::uint8_t>((kept.head + 1) % kKeep);
  }
}

std::optional<std::uint64_t> ReplicaCheck::ValueAt(int rank, std::int64_t step) const {
  // Newest first: the steps compared are nearly always the newest kept.
  const Kept& kept = kept_[static_cast<std::size_t>(rank)];
  for (std::size_t i = kept.size; i-- > 0;) {
    const auto& [s, v] = kept[i];
    if (s == step) return v;
    if (s < step) break;
  }
  return std::nullopt;
}

std::vector<std::int64_t> ReplicaCheck::CommonSteps(const std::vector<int>& ranks, std::int64_t after) const {
  std::vector<std::int64_t> steps;
  if (ranks.empty()) return steps;
  const Kept& first = kept_[static_cast<std::size_t>(ranks[0])];
  for (std::size_t i = 0; i < first.size; ++i) {
    const std::int64_t s = first[i].first;
    if (s <= after) continue;
    bool all = true;
    for (int r : ranks) {
      if (!ValueAt(r, s).has_value()) {
        all = false;
        break;
      }
    }
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
    std::unordered_map<std::uint64_t, std::vector<int>> by_value;
    for (int r : everyone) by_value[*ValueAt(r, step)].push_back(r);
    std::vector<std::vector<int>> groups;
    for (auto& [v, ranks] : by_value) {
      if (ranks.size() >= 2) groups.push_back(std::move(ranks));
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
    const Kept& lead = kept_[static_cast<std::size_t>(set.members[0])];
    for (std::size_t i = 0; i < lead.size; ++i) {
      const auto [step, first] = lead[i];
      if (step <= set.checked) continue;
      // One pass: every member has the step (else it is not compared yet),
      // and whether all agree (nearly always: then no map of values).
      bool common = true, agree = true;
      for (int r : set.members) {
        const auto v = ValueAt(r, step);
        if (!v) {
          common = false;
          break;
        }
        agree = agree && *v == first;
      }
      if (!common) continue;
      set.checked = step;
      if (agree) {
        set.last_agreed = step;
        continue;
      }
      std::map<std::uint64_t, std::vector<int>> by_value;
      for (int r : set.members) by_value[*ValueAt(r, step)].push_back(r);
      Divergence d;
      d.step = step;
      d.last_agreed_step = set.last_agreed;
      d.replicas = set.members;
      for (int r : set.members) d.values[r] = *ValueAt(r, step);
      for (const auto& [v, ranks] : by_value) {
        if (ranks.size() * 2 > set.members.size()) {  // a strict majority: the others diverged
          for (int r : set.members) {
            if (d.values[r] != v) d.diverged.push_back(r);
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
