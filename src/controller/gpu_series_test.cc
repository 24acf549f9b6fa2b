#include "controller/gpu_series.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

v1::GpuHealth Gpu(int index, double sm, double temp, std::int64_t reasons = 0) {
  v1::GpuHealth g;
  g.set_index(index);
  g.set_sm_clock_mhz(sm);
  g.set_memory_clock_mhz(-1);  // not reported
  g.set_temperature_c(temp);
  g.set_power_w(612.5);
  g.set_utilization_pct(97);
  g.set_throttle_reasons(reasons);
  g.set_ecc_uncorrected(0);
  return g;
}

TEST(GpuSeriesTest, AnIntervalKeepsItsLowestClockEveryReasonAndItsLatestFigures) {
  GpuSeries s("j", 10 * kSecond);
  EXPECT_TRUE(s.Add("n0", {Gpu(0, 1980, 60), Gpu(3, 1980, 70)}, 101 * kSecond).empty());
  EXPECT_TRUE(s.Add("n0", {Gpu(0, 1980, 61), Gpu(3, 1410, 88, 0x20)}, 104 * kSecond).empty());
  EXPECT_TRUE(s.Add("n0", {Gpu(0, 1980, 62), Gpu(3, 1700, 86)}, 109 * kSecond).empty());
  EXPECT_EQ(s.open_rows(), 2u);
  auto closed = s.Add("n0", {Gpu(0, 1980, 63), Gpu(3, 1980, 80)}, 111 * kSecond);  // the next interval
  ASSERT_EQ(closed.size(), 2u);
  const GpuSampleRecord& hot = closed[1];
  EXPECT_EQ(hot.job_id, "j");
  EXPECT_EQ(hot.node, "n0");
  EXPECT_EQ(hot.gpu, 3);
  EXPECT_EQ(hot.wall_ns, 100 * kSecond);
  EXPECT_EQ(hot.sm_clock_mhz, 1410);        // its lowest
  EXPECT_EQ(hot.throttle_reasons, 0x20);    // seen once in the interval
  EXPECT_EQ(hot.temperature_c, 86);         // its latest
  EXPECT_EQ(hot.power_mw, 612500);
  EXPECT_EQ(hot.memory_clock_mhz, -1);      // unknown stays unknown
  EXPECT_EQ(closed[0].sm_clock_mhz, 1980);
  EXPECT_EQ(closed[0].temperature_c, 62);
  EXPECT_EQ(s.open_rows(), 2u);
}

TEST(GpuSeriesTest, LateHeartbeatsAreLeftOutAndQuietNodesAreFlushed) {
  GpuSeries s("j", 10 * kSecond);
  s.Add("n0", {Gpu(0, 1980, 60)}, 25 * kSecond);
  EXPECT_TRUE(s.Add("n0", {Gpu(0, 100, 60)}, 19 * kSecond).empty());  // older: left out
  s.Add("n1", {Gpu(0, 1980, 60)}, 45 * kSecond);
  auto flushed = s.Flush(45 * kSecond);  // n0's interval [20, 30) ended 15 s ago
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].node, "n0");
  EXPECT_EQ(flushed[0].sm_clock_mhz, 1980);
  EXPECT_EQ(s.open_rows(), 1u);
}

TEST(GpuSeriesTest, RetentionStepsAreMultiplesOfTheInterval) {
  EXPECT_EQ(GpuSeries("j", 30 * kSecond).KeepEvery(600 * kSecond), 600 * kSecond);
  EXPECT_EQ(GpuSeries("j", 7 * kSecond).KeepEvery(600 * kSecond), 602 * kSecond);
  EXPECT_TRUE(GpuSeries("j", 0).Add("n0", {Gpu(0, 1, 1)}, kSecond).empty());  // no series
}

}  // namespace
}  // namespace trainguard
