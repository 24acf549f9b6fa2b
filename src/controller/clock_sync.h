// ClockSync: each node's clock offset from the controller's, estimated from
// probe round trips (NTP's way): the controller stamps a probe t0, the agent
// answers with its own clock ta, the answer arrives at t1. If the network
// delay is the same both ways, offset = ta - (t0 + t1) / 2, and whatever the
// delays, the true offset lies within (t1 - t0) / 2 of it. The estimate kept
// is that of the shortest round trip among the node's last kSamples probes.
//
// Pure logic: no clock, no I/O. Not thread-safe (the controller's mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

namespace trainguard {

struct ClockEstimate {
  bool known = false;
  std::int64_t offset_us = 0;  // node clock - controller clock
  std::int64_t error_us = 0;   // |true offset - offset_us| <= error_us
};

class ClockSync {
 public:
  static constexpr int kSamples = 16;
  // A probe sent at t0 (controller) answered at ta (node), received at t1.
  // Answers with t1 < t0 (a clock stepped back) are ignored.
  void AddSample(const std::string& node, std::int64_t t0_us, std::int64_t ta_us, std::int64_t t1_us);
  ClockEstimate Estimate(const std::string& node) const;
  void Forget(const std::string& node) { samples_.erase(node); }

 private:
  struct Sample {
    std::int64_t offset_us;
    std::int64_t rtt_us;
  };
  std::map<std::string, std::deque<Sample>> samples_;
};

}  // namespace trainguard
