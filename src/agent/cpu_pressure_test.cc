// The parsers against proc(5) and the cgroup v2 documentation's formats,
// and the sampler on a stand-in /proc and cgroup tree.
#include "agent/cpu_pressure.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace trainguard {
namespace {

namespace fs = std::filesystem;

TEST(CpuPressureTest, ParsesCgroupCpuStatAndProcStat) {
  EXPECT_EQ(CgroupPathsOf("0::/system.slice/trainguard-job.scope\n").v2, "/system.slice/trainguard-job.scope");
  CgroupPaths v1 = CgroupPathsOf("12:cpu,cpuacct:/x\n1:name=systemd:/y\n");  // cgroup v1 only
  EXPECT_EQ(v1.v2, "");
  EXPECT_EQ(v1.v1_cpu, "/x");
  CgroupPaths hybrid = CgroupPathsOf("2:cpuacct:/a\n1:cpu:/job:1\n0::/\n");
  EXPECT_EQ(hybrid.v1_cpu, "/job:1");
  EXPECT_EQ(hybrid.v2, "/");
  EXPECT_EQ(ThrottledUsec("nr_periods 100\nnr_throttled 40\nthrottled_time 51200000\n"), 51200);  // v1: ns
  EXPECT_EQ(ThrottledUsec("usage_usec 803\nuser_usec 600\nsystem_usec 203\nnr_periods 10\nnr_throttled 4\n"
                          "throttled_usec 51200\nnr_bursts 0\nburst_usec 0\n"),
            51200);
  EXPECT_EQ(ThrottledUsec("usage_usec 803\nuser_usec 600\nsystem_usec 203\n"), -1);  // no cpu controller
  auto [steal, total] = StealAndTotal("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 17 0 0\n");
  EXPECT_EQ(steal, 35);
  EXPECT_EQ(total, 1000);
  EXPECT_EQ(StealAndTotal("intr 1 2 3\n").first, -1);
}

TEST(CpuPressureTest, SharesAreTakenBetweenSamples) {
  fs::path root = fs::temp_directory_path() / ("tg-cpu-pressure-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "proc" / "42");
  fs::create_directories(root / "cg" / "job");
  std::ofstream(root / "proc" / "42" / "cgroup") << "0::/job\n";
  auto write = [&](std::int64_t throttled, std::int64_t steal, std::int64_t idle) {
    std::ofstream(root / "cg" / "job" / "cpu.stat") << "usage_usec 1\nthrottled_usec " << throttled << "\n";
    std::ofstream(root / "proc" / "stat") << "cpu  100 0 0 " << idle << " 0 0 0 " << steal << " 0 0\n";
  };
  CpuPressure p((root / "proc").string(), (root / "cg").string());
  write(1000000, 0, 900);
  CpuPressureSample first = p.Sample({42}, 10 * kSecond);
  EXPECT_EQ(first.throttled_pct, -1);  // one sample: no share yet
  EXPECT_EQ(first.steal_pct, -1);
  EXPECT_GE(first.cores, 1);
  write(1500000, 300, 1600);  // +0.5 s throttled in 1 s; 300 of 1000 jiffies stolen
  CpuPressureSample second = p.Sample({42}, 11 * kSecond);
  EXPECT_NEAR(second.throttled_pct, 50, 1e-9);
  EXPECT_NEAR(second.steal_pct, 30, 1e-9);
  CpuPressureSample gone = p.Sample({4242}, 12 * kSecond);  // the rank went: its cgroup is not read
  EXPECT_EQ(gone.throttled_pct, -1);
  fs::remove_all(root);
}

}  // namespace
}  // namespace trainguard
