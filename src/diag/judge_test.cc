#include "diag/judge.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

NodeFigures Node(const std::string& name, double gflops, double write_mbps, double free_gib,
                 const std::string& write_error = "") {
  return {name,
          {{"compute_gflops", gflops, ""},
           {"disk_write_mbps:ckpt", write_error.empty() ? write_mbps : 0, write_error},
           {"disk_free_gib:ckpt", free_gib, ""}}};
}

TEST(DiagJudgeTest, ASlowNodeFailsAgainstTheMedianOfItsPeersAndOnlyIt) {
  auto verdicts = JudgeNodes({Node("n0", 2.0, 500, 50), Node("n1", 1.0, 480, 50), Node("n2", 2.1, 520, 50),
                              Node("n3", 1.9, 510, 50)});
  ASSERT_EQ(verdicts.size(), 4u);
  EXPECT_TRUE(verdicts[0].healthy);
  EXPECT_FALSE(verdicts[1].healthy);
  ASSERT_EQ(verdicts[1].failures.size(), 1u);
  EXPECT_NE(verdicts[1].failures[0].find("compute_gflops 1.00 is 51 % of the median 1.95 of 4 nodes"),
            std::string::npos)
      << verdicts[1].failures[0];
  EXPECT_TRUE(verdicts[2].healthy);
  EXPECT_TRUE(verdicts[3].healthy);
}

TEST(DiagJudgeTest, AFailedProbeAndAFloorFailWithoutPeers) {
  auto verdicts = JudgeNodes({Node("n0", 2.0, 0, 0.0, "write /ckpt/x: No space left on device"),
                              Node("n1", 0.01, 500, 50)});
  EXPECT_FALSE(verdicts[0].healthy);
  EXPECT_NE(verdicts[0].failures[0].find("No space left on device"), std::string::npos);
  EXPECT_NE(verdicts[0].failures[1].find("disk_free_gib:ckpt 0.000 is below the floor 1.00"), std::string::npos);
  EXPECT_FALSE(verdicts[1].healthy);  // below the compute floor, though only 2 nodes (no median)
  EXPECT_EQ(verdicts[1].failures.size(), 1u);
}

TEST(DiagJudgeTest, AWrongKnownAnswerFailsTheNodeWhateverItsPeersDo) {
  std::vector<NodeFigures> nodes;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back({"n" + std::to_string(i),
                     {{"gemm_known_answer_mismatches", 0, ""}, {"gpu_known_answer_mismatches:3", i == 2 ? 17.0 : 0.0, ""}}});
  }
  auto verdicts = JudgeNodes(nodes);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(verdicts[i].healthy, i != 2) << i;
  ASSERT_EQ(verdicts[2].failures.size(), 1u);
  EXPECT_NE(verdicts[2].failures[0].find("gpu_known_answer_mismatches:3"), std::string::npos) << verdicts[2].failures[0];
}

TEST(DiagJudgeTest, TwoNodesAreJudgedByFloorsOnly) {
  auto verdicts = JudgeNodes({Node("n0", 2.0, 500, 50), Node("n1", 0.5, 100, 50)});
  EXPECT_TRUE(verdicts[0].healthy);
  EXPECT_TRUE(verdicts[1].healthy);  // slower, but two nodes say nothing about which one is wrong
}

TEST(DiagJudgeTest, FreeSpaceIsJudgedByTheFloorNotThePeers) {
  auto verdicts = JudgeNodes({Node("n0", 2, 500, 900), Node("n1", 2, 500, 900), Node("n2", 2, 500, 20)});
  EXPECT_TRUE(verdicts[2].healthy);
}

TEST(DiagJudgeTest, OnlyFailuresAgainstThePeersAreWorthRepeating) {
  auto verdicts = JudgeNodes({Node("n0", 2.0, 500, 50), Node("n1", 1.0, 480, 50), Node("n2", 2.1, 520, 50),
                              Node("n3", 1.9, 510, 0.5)});
  EXPECT_FALSE(FailsOnlyAgainstPeers(verdicts[0]));  // healthy
  EXPECT_TRUE(FailsOnlyAgainstPeers(verdicts[1]));   // slow against the median
  EXPECT_FALSE(FailsOnlyAgainstPeers(verdicts[3]));  // below the free-space floor
}

TEST(DiagJudgeTest, BestOfTwoRunsKeepsTheBetterMeasuredValue) {
  std::vector<Figure> first = {{"compute_gflops", 1.0, ""}, {"disk_write_mbps:c", 0, "EIO"}, {"memory_gbps", 9, ""}};
  std::vector<Figure> second = {{"compute_gflops", 2.0, ""}, {"disk_write_mbps:c", 300, ""}, {"memory_gbps", 0, "x"}};
  auto best = BestOf(first, second);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_DOUBLE_EQ(best[0].value, 2.0);
  EXPECT_TRUE(best[1].error.empty());
  EXPECT_DOUBLE_EQ(best[1].value, 300);
  EXPECT_DOUBLE_EQ(best[2].value, 9);  // the second run's error does not replace a measurement
  EXPECT_TRUE(best[2].error.empty());
}

TEST(DiagJudgeTest, ARacksAllReduceAndAProbeThatCouldNotRunAreShownNotJudged) {
  auto verdicts = JudgeNodes({{"a", {{"rack_allreduce_gbps", 0, "rendezvous timed out"},
                                     {"collective_probe", 0, "not run: no torch"},
                                     {"net_rtt_us", 0, "no peer"}}},
                              {"b", {{"alltoall_gbps", 0, "all-to-all delivered wrong data"}}}});
  EXPECT_TRUE(verdicts[0].healthy);
  EXPECT_EQ(verdicts[0].figures.size(), 3u);
  EXPECT_EQ(verdicts[0].figures[0].figure.error, "rendezvous timed out");  // kept, for the record
  EXPECT_FALSE(verdicts[1].healthy);
}

}  // namespace
}  // namespace trainguard
