#include "common/timing_ring.h"

#include <algorithm>
#include <cstring>

namespace trainguard {

int TimingNameIndex(TimingRing* ring, const char* name) {
  int used = std::clamp(ring->names_used.load(std::memory_order_relaxed), 0, kTimingNames);
  std::size_t n = std::min(std::strlen(name), static_cast<std::size_t>(kTimingNameCapacity - 1));
  for (int i = 0; i < used; ++i) {
    if (std::strncmp(ring->names[i], name, n) == 0 && ring->names[i][n] == '\0') return i;
  }
  if (used == kTimingNames) return -1;
  std::memcpy(ring->names[used], name, n);
  ring->names[used][n] = '\0';
  ring->names_used.store(used + 1, std::memory_order_release);  // the name is visible first
  return used;
}

void TimingAppend(TimingRing* ring, int name_index, TimingKind kind, std::int64_t start_mono_ns,
                  std::int64_t duration_ns, std::int64_t after_step, std::int64_t step) {
  if (name_index < 0) {
    ring->names_full.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::uint64_t head = ring->written.load(std::memory_order_relaxed);
  // The slot still holds record head - kTimingRecords, which a reader may be
  // copying: the publication of head (the previous append's store) must be
  // visible to any reader that sees one of the stores below (it then drops
  // that record; see Drain).
  std::atomic_thread_fence(std::memory_order_release);
  TimingRecord& r = ring->records[head % kTimingRecords];
  r.start_mono_ns.store(start_mono_ns, std::memory_order_relaxed);
  r.duration_ns.store(duration_ns, std::memory_order_relaxed);
  r.after_step.store(after_step, std::memory_order_relaxed);
  r.step.store(step, std::memory_order_relaxed);
  r.name_kind.store(static_cast<std::uint32_t>(name_index) << 8 | static_cast<std::uint32_t>(kind),
                    std::memory_order_relaxed);
  ring->written.store(head + 1, std::memory_order_release);
}

std::vector<TimingSample> TimingCursor::Drain(const TimingRing& ring) {
  std::vector<TimingSample> out;
  std::uint64_t head = ring.written.load(std::memory_order_acquire);
  if (head < next_) next_ = head;  // a new writer (the page was reset): start over
  // The oldest slot may be in the middle of its next rewrite: a reader keeps
  // at most kTimingRecords - 1 records behind the head.
  constexpr std::uint64_t kReadable = kTimingRecords - 1;
  if (head - next_ > kReadable) {
    dropped_ += static_cast<std::int64_t>(head - next_ - kReadable);
    next_ = head - kReadable;
  }
  int names = std::clamp(ring.names_used.load(std::memory_order_acquire), 0, kTimingNames);
  struct Raw {
    std::uint64_t index;
    TimingSample sample;
    std::uint32_t name;
  };
  std::vector<Raw> raw;
  raw.reserve(head - next_);
  for (std::uint64_t i = next_; i < head; ++i) {
    const TimingRecord& r = ring.records[i % kTimingRecords];
    Raw x;
    x.index = i;
    x.sample.start_mono_ns = r.start_mono_ns.load(std::memory_order_relaxed);
    x.sample.duration_ns = r.duration_ns.load(std::memory_order_relaxed);
    x.sample.after_step = r.after_step.load(std::memory_order_relaxed);
    x.sample.step = r.step.load(std::memory_order_relaxed);
    std::uint32_t nk = r.name_kind.load(std::memory_order_relaxed);
    x.sample.kind = static_cast<TimingKind>(nk & 0xff);
    x.name = nk >> 8;
    raw.push_back(std::move(x));
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  std::uint64_t after = ring.written.load(std::memory_order_relaxed);
  // The writer may be rewriting the slot of record `after` (not published
  // yet), which held record after - kTimingRecords: that record and older
  // ones may have been read half-rewritten.
  std::uint64_t safe_from = after + 1 > static_cast<std::uint64_t>(kTimingRecords) ? after + 1 - kTimingRecords : 0;
  for (Raw& x : raw) {
    if (x.index < safe_from) {
      ++dropped_;
      continue;
    }
    if (x.sample.kind != TimingKind::kStep) {
      if (static_cast<int>(x.name) >= names) {
        ++dropped_;
        continue;
      }
      const char* s = ring.names[x.name];
      x.sample.name.assign(s, strnlen(s, kTimingNameCapacity));
    }
    out.push_back(std::move(x.sample));
  }
  next_ = head;
  return out;
}

}  // namespace trainguard
