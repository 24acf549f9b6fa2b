#include "controller/clock_sync.h"

namespace trainguard {

void ClockSync::AddSample(const std::string& node, std::int64_t t0_us, std::int64_t ta_us, std::int64_t t1_us) {
  if (t1_us < t0_us) return;
  auto& q = samples_[node];
  // offset = ta - (t0 + t1) / 2, rounded toward the middle.
  q.push_back({ta_us - t0_us - (t1_us - t0_us) / 2, t1_us - t0_us});
  while (q.size() > static_cast<std::size_t>(kSamples)) q.pop_front();
}

ClockEstimate ClockSync::Estimate(const std::string& node) const {
  ClockEstimate e;
  auto it = samples_.find(node);
  if (it == samples_.end() || it->second.empty()) return e;
  const Sample* best = &it->second.front();
  for (const Sample& s : it->second) {
    if (s.rtt_us < best->rtt_us) best = &s;
  }
  e.known = true;
  e.offset_us = best->offset_us;
  e.error_us = (best->rtt_us + 1) / 2;
  return e;
}

}  // namespace trainguard
