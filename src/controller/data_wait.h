// The job's time waiting for data: per step, the longest any rank waited in
// its "data" phase (its peers wait for that rank in their collectives, so
// the job lost the longest wait, not the sum), added up over the steps.
// Bounded: a step older than the newest `window` steps is folded into the
// total, and a late report of a folded step is not counted again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace trainguard {

class StepMaxSum {
 public:
  explicit StepMaxSum(std::size_t window = 64) : window_(window) {}
  void Add(std::int64_t step, double us);
  double TotalUs() const;
  void Reset();

 private:
  std::size_t window_;
  std::map<std::int64_t, double> open_;  // step -> the longest wait reported for it
  double folded_us_ = 0;
  std::int64_t folded_below_ = INT64_MIN;  // steps below it are in folded_us_
};

}  // namespace trainguard
