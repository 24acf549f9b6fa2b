#include "controller/data_wait.h"

#include <algorithm>

namespace trainguard {

void StepMaxSum::Add(std::int64_t step, double us) {
  if (step < folded_below_ || !(us > 0)) return;
  double& m = open_[step];
  m = std::max(m, us);
  while (open_.size() > window_) {
    auto oldest = open_.begin();
    folded_us_ += oldest->second;
    folded_below_ = oldest->first + 1;
    open_.erase(oldest);
  }
}

double StepMaxSum::TotalUs() const {
  double total = folded_us_;
  for (const auto& [step, us] : open_) total += us;
  return total;
}

void StepMaxSum::Reset() {
  open_.clear();
  folded_us_ = 0;
  folded_below_ = INT64_MIN;
}

}  // namespace trainguard
