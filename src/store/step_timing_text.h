// The text forms of a step's timings in the store (docs/telemetry.md):
//   intervals: "name,kind,start_us,duration_us[,group,seq,peer,numel];..."
//   totals:    "key=us;..." with key = the phase ("forward"), "gpu:" + the
//              phase for device time, "cpu:" + the phase for its CPU time,
//              "comm:" + the operation for
//              collectives and send/recv.
// Names lose the separators (',', ';', '=' become '_').
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

// Interval kinds (the protocol's PhaseInterval.kind).
constexpr int kIntervalPhase = 1;
constexpr int kIntervalDevice = 3;
constexpr int kIntervalCpu = 4;  // CPU time of a compute phase (its start is the phase's)
constexpr int kIntervalCollective = 10;
constexpr int kIntervalSend = 11;
constexpr int kIntervalRecv = 12;

struct TimedInterval {
  std::string name;
  int kind = kIntervalPhase;
  std::int64_t start_us = 0;  // since the step's start
  std::int64_t duration_us = 0;
  std::int32_t group_id = -1;
  std::int64_t seq = 0;
  std::int32_t peer = -1;
  std::int64_t numel = 0;
};

using PhaseTotals = std::vector<std::pair<std::string, std::int64_t>>;  // in order of first appearance

bool IsOperation(int kind);
std::string TotalsKey(const TimedInterval& i);
PhaseTotals SumByKey(const std::vector<TimedInterval>& intervals);
std::string EncodeIntervals(const std::vector<TimedInterval>& intervals);
StatusOr<std::vector<TimedInterval>> DecodeIntervals(const std::string& text);
std::string EncodeTotals(const PhaseTotals& totals);
StatusOr<PhaseTotals> DecodeTotals(const std::string& text);

}  // namespace trainguard
