// The timing ring, a region of the status page (docs/status_page.md): the
// intervals a rank spent in each phase, in the order the client closed them,
// and one record per step. The client is the only writer (one thread at a
// time: it holds a mutex); the agent drains the ring on its own schedule
// without a lock. Single writer, so the ring needs no per-record lock: the
// writer fills a record, then advances `written`; a reader copies what it
// has not read yet and re-reads `written` afterwards, discarding (and
// counting as dropped) every record the writer may have reused meanwhile.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainguard {

constexpr int kTimingRecords = 192;
constexpr int kTimingNames = 48;
constexpr int kTimingNameCapacity = 24;  // including the terminating NUL

// What a record times.
enum class TimingKind : std::uint8_t {
  kPhase = 1,  // time in a phase, on the monotonic clock
  kStep = 2,   // one step: from the previous step() (or init()) to this one
  kGpu = 3,    // device time of a phase, from CUDA events (start: when recorded)
  kCpu = 4,    // CPU time of a compute phase (every thread of the process; start: the phase's, monotonic)
};

struct TimingRecord {
  std::atomic<std::int64_t> start_mono_ns;
  std::atomic<std::int64_t> duration_ns;
  // The step the interval belongs to, as the last finished step when it
  // began: -1 (kNoStep) before the first step(). A step record's own value
  // is in `step`; its after_step is the step before it.
  std::atomic<std::int64_t> after_step;
  std::atomic<std::int64_t> step;       // step records: the finished step; else 0
  std::atomic<std::uint32_t> name_kind;  // name index << 8 | TimingKind
  std::uint32_t reserved;
};

struct TimingRing {
  std::atomic<std::uint64_t> written;   // records written so far (the ring's head)
  std::atomic<std::int32_t> names_used;
  std::atomic<std::int32_t> names_full;  // intervals not recorded: the name table was full
  char names[kTimingNames][kTimingNameCapacity];
  TimingRecord records[kTimingRecords];
};
static_assert(sizeof(TimingRecord) == 40);
static_assert(offsetof(TimingRing, names) == 16 && offsetof(TimingRing, records) == 1168);
static_assert(sizeof(TimingRing) == 1168 + 40 * kTimingRecords);

// Writer side; callers serialize these.
// The index of `name` in the ring's name table, adding it if new; -1 when
// the table is full (the interval is then counted in names_full).
int TimingNameIndex(TimingRing* ring, const char* name);
void TimingAppend(TimingRing* ring, int name_index, TimingKind kind, std::int64_t start_mono_ns,
                  std::int64_t duration_ns, std::int64_t after_step, std::int64_t step);

// Reader side.
struct TimingSample {
  std::string name;  // "" for step records
  TimingKind kind = TimingKind::kPhase;
  std::int64_t start_mono_ns = 0;
  std::int64_t duration_ns = 0;
  std::int64_t after_step = -1;
  std::int64_t step = 0;
};

// Drains a ring: what was written since the cursor's last call, oldest
// first. `dropped` counts records the writer overwrote before they were
// read (the reader was too slow). One cursor per ring; not thread-safe.
class TimingCursor {
 public:
  std::vector<TimingSample> Drain(const TimingRing& ring);
  std::int64_t dropped() const { return dropped_; }

 private:
  std::uint64_t next_ = 0;
  std::int64_t dropped_ = 0;
};

}  // namespace trainguard
