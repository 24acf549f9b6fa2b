// TimingCollector: turns one rank's status page into per-step timings. It
// drains the page's timing ring (phases, device times, steps) and the
// completed operations of its journal, and groups them by step: a phase
// belongs to the step that was in progress when it began; an operation to
// the step in progress when it was issued. A finished step is held back
// until the next one finishes, so that device times (read back a little
// later than their step) land in the right step.
//
// Threading: one collector per rank, used by the agent's control loop only.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/status_page.h"
#include "proto/protocol.h"

namespace trainguard {

// Interval kinds, as in the protocol's PhaseInterval.kind.
enum class IntervalKind : int { kPhase = 1, kDevice = 3, kCpu = 4, kCollective = 10, kSend = 11, kRecv = 12 };

struct CollectedInterval {
  std::string name;  // the phase, or the operation ("all_reduce")
  IntervalKind kind = IntervalKind::kPhase;
  std::int64_t start_mono_ns = 0;
  std::int64_t duration_ns = 0;
  std::int32_t group_id = -1;
  std::int64_t seq = 0;
  std::int32_t peer = -1;
  std::int64_t numel = 0;
};

struct CollectedStep {
  std::int64_t step = 0;
  std::int64_t start_mono_ns = 0;
  std::int64_t duration_ns = 0;
  std::vector<CollectedInterval> intervals;  // in the order they began
};

class TimingCollector {
 public:
  // Reads what is new on the page. Call often enough (the agent: every
  // 20 ms) that the ring (192 records) and journal (128) do not overrun.
  void Poll(const StatusPage& page);
  // Steps finished and complete; `flush` also gives the one held back
  // (the rank stopped).
  std::vector<CollectedStep> Take(bool flush);
  // Records lost so far: overrun rings, full name tables, journal overruns.
  std::int64_t dropped() const;

 private:
  void CloseStep(const TimingSample& step);
  void AddOps(const OpJournal& journal);

  TimingCursor cursor_;
  std::map<std::int64_t, std::vector<CollectedInterval>> open_;  // by after_step
  std::vector<CollectedInterval> ops_;     // completed operations not yet in a step
  std::vector<CollectedStep> closed_;      // oldest first; the newest is held back
  // Operations already taken, by (issued, kind, seq, peer), at or after
  // ops_watermark_ (the oldest operation still in flight at the last poll).
  std::set<std::tuple<std::int64_t, int, std::int64_t, std::int32_t>> ops_taken_;
  std::int64_t ops_watermark_ = 0;
  std::uint64_t journal_seen_ = 0;         // the journal's next_record at the last poll
  std::int64_t ops_dropped_ = 0;
  std::int64_t names_full_ = 0;
};

// Appends a rank's collected steps to a Timings message: times converted
// from the pages' clock (CLOCK_MONOTONIC) by adding `to_unix_ns`, interval
// starts made relative to their step, names entered once in `names` (the
// message's name table, by name).
void AddSteps(int global_rank, const std::vector<CollectedStep>& steps, std::int64_t to_unix_ns,
              v1::Timings* timings, std::map<std::string, int>* names);

}  // namespace trainguard
