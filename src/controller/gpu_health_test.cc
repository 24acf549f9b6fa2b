#include "controller/gpu_health.h"

#include <gtest/gtest.h>

#include "common/gpu_reasons.h"

namespace trainguard {
namespace {

v1::GpuHealth Gpu(int index, double sm_mhz, std::int64_t throttle, std::int64_t uncorrected = 0,
                  std::int64_t pending = 0) {
  v1::GpuHealth g;
  g.set_index(index);
  g.set_sm_clock_mhz(sm_mhz);
  g.set_throttle_reasons(throttle);
  g.set_ecc_uncorrected(uncorrected);
  g.set_remapped_rows_pending(pending);
  g.set_remapped_rows_failed(0);
  return g;
}

TEST(GpuHealthTest, ErrorCountersThatGrewAreSaidCorrectedOnesAreNot) {
  std::vector<v1::GpuHealth> before = {Gpu(0, 1980, 0), Gpu(1, 1980, 0)};
  std::vector<v1::GpuHealth> now = {Gpu(0, 1980, 0), Gpu(1, 1980, 0, 1, 1)};
  now[0].set_ecc_corrected(500);  // corrected errors alone: the ECC did its job
  EXPECT_EQ(GpuErrorIncreases(before, now),
            (std::vector<std::string>{"GPU 1: uncorrected ECC errors 0 -> 1", "GPU 1: row remaps pending 0 -> 1"}));
  EXPECT_TRUE(GpuErrorIncreases(now, now).empty());
  before[1].set_ecc_uncorrected(-1);  // unknown before: not an increase
  EXPECT_EQ(GpuErrorIncreases(before, now).size(), 1u);
  EXPECT_TRUE(GpuErrorIncreases({}, now).empty());  // the node's first heartbeat
}

TEST(GpuHealthTest, NewHardwareXidsAreSaidAnApplicationsXidsAreNot) {
  std::vector<v1::GpuHealth> before = {Gpu(0, 1980, 0), Gpu(1, 1980, 0)};
  for (auto& g : before) {
    g.set_xid_events(0);
    g.set_last_xid(-1);
  }
  std::vector<v1::GpuHealth> now = before;
  now[1].set_xid_events(2);
  now[1].set_last_xid(79);
  EXPECT_EQ(GpuErrorIncreases(before, now), (std::vector<std::string>{"GPU 1: Xid 79 (2 new)"}));
  now[1].set_last_xid(31);  // an MMU fault: the application's own bad address
  EXPECT_TRUE(GpuErrorIncreases(before, now).empty());
  before[1].set_xid_events(-1);  // NVML could not watch it before: not an increase
  now[1].set_last_xid(48);
  EXPECT_TRUE(GpuErrorIncreases(before, now).empty());
  EXPECT_TRUE(XidMeansHardware(94) && XidMeansHardware(63) && !XidMeansHardware(13) && !XidMeansHardware(43));
}

TEST(GpuHealthTest, AThrottledGPUSlowerThanTheOtherNodesIsTheStragglersCause) {
  std::map<std::string, std::vector<v1::GpuHealth>> gpus = {
      {"node0", {Gpu(0, 1980, 0), Gpu(1, 1975, 0)}},
      {"node1", {Gpu(0, 1980, 0), Gpu(1, 1980, 0)}},
      {"node7", {Gpu(0, 1980, 0), Gpu(3, 1410, 0x40)}},
  };
  EXPECT_EQ(GpuSlowCause("node7", gpus),
            "GPU 3 held down by hw_thermal_slowdown at 1410 MHz (the other nodes' GPUs: 1980 MHz)");
  EXPECT_EQ(GpuSlowCause("node0", gpus), "");
  // Every node's GPUs held down alike (a power cap on the whole job): no one node's cause.
  for (auto& [n, list] : gpus) {
    for (auto& g : list) {
      g.set_sm_clock_mhz(1410);
      g.set_throttle_reasons(0x4);
    }
  }
  EXPECT_EQ(GpuSlowCause("node7", gpus), "");
  EXPECT_EQ(GpuSlowCause("node9", gpus), "");
}

}  // namespace
}  // namespace trainguard
