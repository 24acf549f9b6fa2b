#include "common/clock.h"

#include <time.h>

namespace trainguard {

static Nanos Read(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<Nanos>(ts.tv_sec) * kSecond + ts.tv_nsec;
}

Nanos MonotonicNowNanos() { return Read(CLOCK_MONOTONIC); }
Nanos WallNowNanos() { return Read(CLOCK_REALTIME); }
Nanos RealClock::MonotonicNanos() const { return Read(CLOCK_MONOTONIC); }
Nanos RealClock::WallNanos() const { return Read(CLOCK_REALTIME); }

RealClock* RealClock::Get() {
  static RealClock clock;
  return &clock;
}

}  // namespace trainguard
