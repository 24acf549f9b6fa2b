#include "controller/clock_sync.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace trainguard {
namespace {

TEST(ClockSyncTest, TheShortestRoundTripGivesTheOffsetAndItsBound) {
  ClockSync s;
  EXPECT_FALSE(s.Estimate("n").known);
  // True offset +5000 us. A slow answer (delay on the way back) and a quick one.
  s.AddSample("n", 1000, 1000 + 5000 + 100, 1000 + 4000);  // rtt 4000: estimate 5100 - 2000 = 3100
  s.AddSample("n", 9000, 9000 + 5000 + 50, 9000 + 100);    // rtt 100: estimate 5000
  ClockEstimate e = s.Estimate("n");
  ASSERT_TRUE(e.known);
  EXPECT_EQ(e.offset_us, 5000);
  EXPECT_EQ(e.error_us, 50);
  EXPECT_LE(std::llabs(e.offset_us - 5000), e.error_us);
}

TEST(ClockSyncTest, KeepsTheLastSamplesAndIgnoresAClockSteppedBack) {
  ClockSync s;
  s.AddSample("n", 0, 10, 2);  // rtt 2, offset 9
  for (int i = 1; i <= ClockSync::kSamples; ++i) s.AddSample("n", i * 1000, i * 1000 + 300 + 10, i * 1000 + 20);
  ClockEstimate e = s.Estimate("n");
  EXPECT_EQ(e.error_us, 10);  // the rtt-2 sample has aged out
  EXPECT_EQ(e.offset_us, 300);
  s.AddSample("n", 5000, 0, 4000);  // received before it was sent: ignored
  EXPECT_EQ(s.Estimate("n").offset_us, 300);
  s.Forget("n");
  EXPECT_FALSE(s.Estimate("n").known);
  EXPECT_FALSE(s.Estimate("other").known);
}

}  // namespace
}  // namespace trainguard
