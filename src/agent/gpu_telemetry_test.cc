// GPU telemetry against a stand-in NVML (fake_nvml.cc, NVML's signatures)
// and nvidia-smi's documented CSV format: this machine has no GPU.
#include "agent/gpu_telemetry.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include "testing/wait_until.h"

namespace trainguard {
namespace {

TEST(GpuTelemetryTest, NvmlLoadedAtRunTimeGivesEveryGpusFigures) {
  setenv("TG_FAKE_NVML_GPUS", "8", 1);
  std::string why;
  auto nvml = Nvml::Open(TG_FAKE_NVML, &why);
  ASSERT_NE(nvml, nullptr) << why;
  auto gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 8u);
  const GpuSample& g = gpus[3];
  EXPECT_EQ(g.index, 3);
  EXPECT_EQ(g.utilization_pct, 93);
  EXPECT_EQ(g.sm_clock_mhz, 1410);
  EXPECT_EQ(g.memory_clock_mhz, 2619);
  EXPECT_EQ(g.temperature_c, 91);
  EXPECT_DOUBLE_EQ(g.power_w, 653.0);
  EXPECT_EQ(ThrottleReasonNames(g.throttle_reasons),
            (std::vector<std::string>{"sw_thermal_slowdown", "hw_thermal_slowdown"}));
  EXPECT_EQ(g.ecc_corrected, 15);
  EXPECT_EQ(g.ecc_uncorrected, 0);
  EXPECT_EQ(g.remapped_rows_pending, 0);
  EXPECT_EQ(g.pcie_replays, 3);
  EXPECT_EQ(g.nvlink_errors, 8);  // 4 links x 2 replays
  EXPECT_TRUE(ThrottleReasonNames(gpus[0].throttle_reasons).empty());
}

// The stand-in NVML's Xid file of node `node` (fake_nvml.cc), in a directory
// of its own; removed, and the stand-in told to forget it, at the end.
struct XidFile {
  explicit XidFile(const char* node) {
    if (mkdtemp(dir) == nullptr) std::abort();
    setenv("TG_FAKE_NVML_XID_DIR", dir, 1);
    setenv("TG_FAKE_NVML_NODE", node, 1);
    path = std::string(dir) + "/" + node;
  }
  ~XidFile() {
    unlink(path.c_str());
    rmdir(dir);
    unsetenv("TG_FAKE_NVML_XID_DIR");
    unsetenv("TG_FAKE_NVML_NODE");
  }
  char dir[32] = "/tmp/tg-xid-XXXXXX";
  std::string path;
};

TEST(GpuTelemetryTest, XidsComeFromNvmlsEventSetEachCountedOnceOnItsGpu) {
  setenv("TG_FAKE_NVML_GPUS", "4", 1);
  XidFile xids("n1");
  const std::string& file = xids.path;
  std::string why;
  auto nvml = Nvml::Open(TG_FAKE_NVML, &why);
  ASSERT_NE(nvml, nullptr) << why;
  auto gpus = nvml->Sample();
  ASSERT_EQ(gpus.size(), 4u);
  EXPECT_EQ(gpus[2].xid_events, 0);  // watched, none yet
  EXPECT_EQ(gpus[2].last_xid, -1);
  { std::ofstream(file) << "2 79\n"; }
  gpus = nvml->Sample();
  EXPECT_EQ(gpus[2].xid_events, 1);
  EXPECT_EQ(gpus[2].last_xid, 79);
  EXPECT_EQ(gpus[1].xid_events, 0);
  { std::ofstream(file, std::ios::app) << "2 48\n1 13\n"; }
  gpus = nvml->Sample();
  EXPECT_EQ(gpus[2].xid_events, 2);  // the first not counted again
  EXPECT_EQ(gpus[2].last_xid, 48);
  EXPECT_EQ(gpus[1].xid_events, 1);
  EXPECT_EQ(gpus[1].last_xid, 13);
}

TEST(GpuTelemetryTest, AFreshSampleIsTakenOnDemandBetweenIntervals) {
  setenv("TG_FAKE_NVML_GPUS", "2", 1);
  XidFile xids("n2");
  const std::string& file = xids.path;
  GpuTelemetry t({TG_FAKE_NVML, "", 3600 * kSecond});  // one sample an hour, unless asked
  ASSERT_TRUE(testutil::WaitUntil([&] { return !t.Latest().empty(); }, std::chrono::seconds(10)));
  EXPECT_EQ(t.Latest()[1].xid_events, 0);
  { std::ofstream(file) << "1 94\n"; }
  EXPECT_EQ(t.Latest()[1].xid_events, 0);  // the hourly sample does not know it
  auto fresh = t.Fresh(10 * kSecond);
  ASSERT_EQ(fresh.size(), 2u);
  EXPECT_EQ(fresh[1].xid_events, 1);
  EXPECT_EQ(fresh[1].last_xid, 94);
  GpuTelemetry none({"/nonexistent/libnvidia-ml.so.1", "/nonexistent/nvidia-smi", 3600 * kSecond});
  EXPECT_TRUE(none.Fresh(10 * kSecond).empty());  // no GPU: at once, not after the timeout
}

TEST(GpuTelemetryTest, NoNvmlOrAFailedInitIsSaidAndNothingIsSampled) {
  std::string why;
  EXPECT_EQ(Nvml::Open("/nonexistent/libnvidia-ml.so.1", &why), nullptr);
  EXPECT_NE(why.find("NVML not loaded"), std::string::npos) << why;
  setenv("TG_FAKE_NVML_FAIL", "1", 1);
  EXPECT_EQ(Nvml::Open(TG_FAKE_NVML, &why), nullptr);
  EXPECT_NE(why.find("nvmlInit failed with NVML error 9"), std::string::npos) << why;
  unsetenv("TG_FAKE_NVML_FAIL");
  GpuTelemetry none({"/nonexistent/libnvidia-ml.so.1", "/nonexistent/nvidia-smi", 10 * kMillisecond});
  EXPECT_EQ(none.source(), "");
  EXPECT_TRUE(none.Latest().empty());
}

TEST(GpuTelemetryTest, TheSamplingThreadKeepsTheNewestSampleForTheHeartbeat) {
  setenv("TG_FAKE_NVML_GPUS", "2", 1);
  GpuTelemetry t({TG_FAKE_NVML, "", 10 * kMillisecond});
  ASSERT_TRUE(testutil::WaitUntil([&] { return !t.Latest().empty(); }, std::chrono::seconds(10)));
  EXPECT_EQ(t.source(), "nvml");
  ASSERT_EQ(t.Latest().size(), 2u);
  EXPECT_EQ(t.Latest()[1].temperature_c, 61);
}

TEST(GpuTelemetryTest, NvidiaSmisCsvWithUnsupportedCells) {
  // nvidia-smi --query-gpu=<kNvidiaSmiGpuQuery> --format=csv,noheader,nounits
  auto gpus = ParseNvidiaSmiGpus(
      "0, 98, 41, 1980, 2619, 62, 655.27, 0x0000000000000000, 0, 0\n"
      "1, 97, 40, 1410, 2619, 89, 612.10, 0x0000000000000040, 12, 0\n"
      "2, [N/A], [N/A], [N/A], [N/A], 35, [Not Supported], [Not Supported], [N/A], [N/A]\n"
      "garbage line\n");
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].sm_clock_mhz, 1980);
  EXPECT_DOUBLE_EQ(gpus[0].power_w, 655.27);
  EXPECT_EQ(gpus[1].throttle_reasons, 0x40);
  EXPECT_EQ(ThrottleReasonNames(gpus[1].throttle_reasons), std::vector<std::string>{"hw_thermal_slowdown"});
  EXPECT_EQ(gpus[1].ecc_corrected, 12);
  EXPECT_EQ(gpus[2].utilization_pct, -1);
  EXPECT_EQ(gpus[2].temperature_c, 35);
  EXPECT_EQ(gpus[2].throttle_reasons, -1);
}

}  // namespace
}  // namespace trainguard
