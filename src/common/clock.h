// Clock: the only way controller and agent logic read time.
//
// RealClock reads CLOCK_MONOTONIC and CLOCK_REALTIME; FakeClock is advanced by
// tests and the simulator. Daemons drive their logic with periodic Tick()
// calls whose "now" comes from the injected clock, so a test advances the fake
// clock and calls Tick() instead of sleeping.
// Thread safety: both implementations may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace trainguard {

using Nanos = std::int64_t;
constexpr Nanos kMillisecond = 1'000'000;
constexpr Nanos kSecond = 1'000'000'000;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time, for durations and deadlines.
  virtual Nanos MonotonicNanos() const = 0;
  // Unix wall time, for timestamps that are stored or shown.
  virtual Nanos WallNanos() const = 0;
};

class RealClock final : public Clock {
 public:
  Nanos MonotonicNanos() const override;
  Nanos WallNanos() const override;
  static RealClock* Get();
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(Nanos wall_start = 1'700'000'000 * kSecond) : wall_offset_(wall_start) {}
  Nanos MonotonicNanos() const override { return mono_.load(); }
  Nanos WallNanos() const override { return wall_offset_ + mono_.load(); }
  void Advance(Nanos d) { mono_ += d; }

 private:
  std::atomic<Nanos> mono_{kSecond};
  Nanos wall_offset_;
};

// CLOCK_MONOTONIC in nanoseconds; what the client stamps into status pages.
Nanos MonotonicNowNanos();
Nanos WallNowNanos();

}  // namespace trainguard
