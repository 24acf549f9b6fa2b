#include "controller/numeric_check.h"

#include <algorithm>
#include <climits>

namespace trainguard {

std::vector<int> NumericFinding::Ranks() const {
  std::vector<int> out;
  for (const auto& [r, _] : flagged) out.push_back(r);
  return out;
}

void NumericCheck::Reset(int world_size) {
  ranks_.assign(world_size > 0 ? world_size : 0, Rank{});
  min_dirty_ = true;
  pending_[0] = pending_[1] = Pending{};
  last_scan_[0] = last_scan_[1] = last_pass_scan_ = 0;
}

void NumericCheck::Observe(int rank, std::int64_t step, std::int64_t losses_observed) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[rank];
  if (step > r.step) {
    // The lowest step moves only when the last rank at it moves on.
    if (!min_dirty_ && r.step == min_step_ && --at_min_ == 0) min_dirty_ = true;
    r.step = step;
  }
  r.observer = r.observer || losses_observed > 0;
}

void NumericCheck::Flag(int rank, bool spike, std::int64_t step, int kind, double value) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size()) || step < 0) return;
  const int w = spike ? 1 : 0;
  Rank& r = ranks_[rank];
  if (r.flag_step[w] >= 0) return;  // each process reports its first only
  r.flag_step[w] = step;
  r.kind[w] = kind;
  r.value[w] = value;
  r.observer = true;
  Pending& p = pending_[w];
  if (p.reported) return;
  if (p.step < 0 || step < p.step) p.step = step;
}

std::optional<NumericFinding> NumericCheck::Judge(int w, Nanos now) {
  Pending& p = pending_[w];
  if (p.reported || p.step < 0) return std::nullopt;
  if (p.first_seen == 0) p.first_seen = now;
  if (last_scan_[w] != 0 && now - last_scan_[w] < kScanEvery && now - p.first_seen < kGrace) return std::nullopt;
  last_scan_[w] = now;
  NumericFinding f;
  f.spike = w == 1;
  f.step = p.step;
  bool complete = true;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    const bool flagged = r.flag_step[w] >= 0 && r.flag_step[w] <= p.step;
    // Every rank, observer or not: one not heard from since before the step may yet check (and flag) it.
    if (!flagged && r.step < p.step) complete = false;
    if (!r.observer) continue;
    ++f.observers;
    if (flagged && r.flag_step[w] == p.step) f.flagged[static_cast<int>(i)] = {r.kind[w], r.value[w]};
  }
  if (!complete && now - p.first_seen < kGrace) return std::nullopt;
  f.all = static_cast<int>(f.flagged.size()) == f.observers;
  p.reported = true;
  return f;
}

std::vector<NumericFinding> NumericCheck::Evaluate(Nanos now) {
  std::vector<NumericFinding> out;
  for (int w = 0; w < 2; ++w) {
    if (auto f = Judge(w, now)) out.push_back(*f);
  }
  return out;
}

std::int64_t NumericCheck::CleanThrough() const {
  if (ranks_.empty()) return -1;
  if (min_dirty_) {  // a scan only when the lowest step may have moved (100,000 ranks)
    min_step_ = INT64_MAX;
    at_min_ = 0;
    for (const Rank& r : ranks_) {
      if (r.step < min_step_) {
        min_step_ = r.step;
        at_min_ = 0;
      }
      if (r.step == min_step_) ++at_min_;
    }
    min_dirty_ = false;
  }
  std::int64_t through = min_step_;
  if (pending_[0].step >= 0) through = std::min(through, pending_[0].step - 1);
  return through;
}

bool NumericCheck::PassedClean(std::int64_t step, Nanos now) {
  if (pending_[0].step >= 0 && pending_[0].step <= step) return false;
  if (last_pass_scan_ != 0 && now - last_pass_scan_ < kScanEvery) return false;
  last_pass_scan_ = now;
  bool any = false;
  for (const Rank& r : ranks_) {
    if (r.step < step) return false;
    any = any || r.observer;
  }
  return any;
}

}  // namespace trainguard
