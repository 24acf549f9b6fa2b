#include "controller/checkpoint_planner.h"

#include <gtest/gtest.h>

#include <cmath>

namespace trainguard {
namespace {

// The interval that minimizes CheckpointOverhead, found by a scan.
double ScannedOptimum(double cost, double mtbf) {
  double best = 0, best_overhead = 2;
  for (double t = 0.01; t < 4 * mtbf; t *= 1.0005) {
    const double o = CheckpointOverhead(t, cost, mtbf, 0);
    if (o < best_overhead) {
      best_overhead = o;
      best = t;
    }
  }
  return best;
}

TEST(CheckpointPlannerTest, DalysIntervalIsYoungsForCheapSavesAndMinimizesTheOverhead) {
  // A save blocking 0.159 s, a failure every 18 minutes (100,000 GPUs at Meta RSC's rate).
  const double daly = OptimalCheckpointInterval(0.159, 1080);
  EXPECT_NEAR(daly, std::sqrt(2 * 0.159 * 1080), 0.25);  // Young's 18.5 s
  const double scanned = ScannedOptimum(0.159, 1080);
  EXPECT_NEAR(daly, scanned, 0.02 * scanned);
  EXPECT_LT(CheckpointOverhead(daly, 0.159, 1080, 0) - CheckpointOverhead(scanned, 0.159, 1080, 0), 1e-4);
  // 30 minutes costs far more than the optimum.
  EXPECT_GT(CheckpointOverhead(1800, 0.159, 1080, 0), 10 * CheckpointOverhead(daly, 0.159, 1080, 0));
  // A save dearer than two MTBFs: save once per MTBF; a free save: as often as the tier writes.
  EXPECT_EQ(OptimalCheckpointInterval(3000, 1000), 1000);
  EXPECT_EQ(OptimalCheckpointInterval(0, 1000), 0);
  EXPECT_EQ(OptimalCheckpointInterval(1, 0), 0);
}

TEST(CheckpointPlannerTest, TheRateStartsAtThePriorAndMovesToWhatTheJobSees) {
  FailureRateEstimate r(2e-5, 3);
  EXPECT_DOUBLE_EQ(r.PerGpuHour(), 2e-5);
  // Ten times the prior's rate, seen over a long exposure: the estimate follows the job.
  r.Observe(1e7, 2000, 40);
  EXPECT_NEAR(r.PerGpuHour(), 2e-4, 2e-4 * 0.02);
  EXPECT_NEAR(r.StorageLossShare(), 0.02, 0.001);
  // Few incidents move it a little only.
  FailureRateEstimate early(2e-5, 3);
  early.Observe(1000, 1, 1);
  EXPECT_GT(early.PerGpuHour(), 2e-5);
  EXPECT_LT(early.PerGpuHour(), 2 * 2e-5);
  EXPECT_GT(early.StorageLossShare(), 0.02);
  // No prior: the job's own rate.
  FailureRateEstimate none(0, 3);
  none.Observe(100, 2, 0);
  EXPECT_DOUBLE_EQ(none.PerGpuHour(), 0.02);
}

TEST(CheckpointPlannerTest, MemoryForEveryFailureStorageForTheLossesOnlyItRestores) {
  FailureRateEstimate r(6.5 / (1000 * 24 * 8), 3);  // 6.5 failures per 1000 node-days of 8 GPUs
  r.SetPriorStorageShare(0.02);
  CheckpointPlan p = PlanCheckpoints(r, 100000, TierCost{0.159, 2}, TierCost{0.159, 30});
  EXPECT_NEAR(p.job_mtbf_s, 86400.0 * 1000 * 8 / (6.5 * 100000), 1);  // ~17.7 minutes
  EXPECT_NEAR(p.memory_interval_s, OptimalCheckpointInterval(0.159, p.job_mtbf_s), 1e-9);
  EXPECT_NEAR(p.storage_mtbf_s, p.job_mtbf_s / 0.02, 1);
  EXPECT_NEAR(p.storage_interval_s, OptimalCheckpointInterval(0.159, p.storage_mtbf_s), 1e-9);
  EXPECT_GT(p.storage_interval_s, 5 * p.memory_interval_s);
  EXPECT_LT(p.expected_overhead, 0.03);
  EXPECT_NE(p.basis.find("memory every 18 s"), std::string::npos) << p.basis;
  // A tier that cannot write that often is planned at the rate it can.
  EXPECT_EQ(PlanCheckpoints(r, 100000, TierCost{0.159, 60}, TierCost{0.159, 30}).memory_interval_s, 60);
  // Without a memory tier, storage carries every failure.
  CheckpointPlan one = PlanCheckpoints(r, 100000, TierCost{-1, 0}, TierCost{0.159, 30});
  EXPECT_EQ(one.memory_interval_s, 0);
  // (at the 30 s its write takes, above the 18 s the rate alone asks)
  EXPECT_EQ(one.storage_interval_s, 30) << one.basis;
  EXPECT_EQ(PlanCheckpoints(r, 100000, TierCost{-1, 0}, TierCost{0.159, 5}).storage_interval_s, p.memory_interval_s);
  EXPECT_TRUE(one.Differs(p));
  CheckpointPlan near = p;
  near.memory_interval_s *= 1.05;
  EXPECT_FALSE(near.Differs(p));
  near.memory_interval_s = p.memory_interval_s * 1.2;
  EXPECT_TRUE(near.Differs(p));
}

}  // namespace
}  // namespace trainguard
