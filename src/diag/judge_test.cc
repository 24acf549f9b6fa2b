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

TEST(DiagJudgeTest, OnlySpeedsThatFailAreWorthMeasuringAgain) {
  auto verdicts = JudgeNodes({Node("n0", 2.0, 500, 50), Node("n1", 1.0, 480, 50), Node("n2", 2.1, 520, 50),
                              Node("n3", 1.9, 510, 0.5), Node("n4", 0.03, 500, 50), Node("n5", 0.03, 500, 0.5),
                              Node("n6", 2.0, 0, 50, "write /ckpt/x: Input/output error")});
  EXPECT_FALSE(WorthMeasuringAgain(verdicts[0]));  // healthy
  EXPECT_TRUE(WorthMeasuringAgain(verdicts[1]));   // slow against the median
  EXPECT_FALSE(WorthMeasuringAgain(verdicts[3]));  // below the free-space floor: no busy host lowers it
  // Below the compute floor: a host busy enough lowers any speed that far
  // (0.031 GFLOP/s was measured on a healthy node of a loaded CI machine).
  EXPECT_TRUE(WorthMeasuringAgain(verdicts[4]));
  EXPECT_FALSE(WorthMeasuringAgain(verdicts[5]));  // a slow speed beside a failure that is not one
  EXPECT_FALSE(WorthMeasuringAgain(verdicts[6]));  // an error
  // A fault count above its ceiling is not a speed.
  auto ecc = JudgeNodes({{"n0", {{"compute_gflops", 2.0, ""}, {"gpu_ecc_uncorrected:0", 3, ""}}}});
  ASSERT_FALSE(ecc[0].healthy);
  EXPECT_FALSE(WorthMeasuringAgain(ecc[0]));
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

TEST(DiagJudgeTest, GpuModelsAreReadFromTheDriversNames) {
  JudgePolicy p;
  EXPECT_EQ(GpuModel("NVIDIA H100 80GB HBM3", p), "H100");
  EXPECT_EQ(GpuModel("NVIDIA A100-SXM4-80GB", p), "A100");
  EXPECT_EQ(GpuModel("NVIDIA A10", p), "A10");
  EXPECT_EQ(GpuModel("Tesla V100-SXM2-16GB", p), "V100");
  EXPECT_EQ(GpuModel("NVIDIA GH200 480GB", p), "GH200");
  EXPECT_EQ(GpuModel("NVIDIA H200", p), "H200");
  EXPECT_EQ(GpuModel("NVIDIA GeForce RTX 4090", p), "");  // not listed: generic floors only
  EXPECT_EQ(GpuModel("", p), "");
}

// One node's GPUs as the probe reports them: GEMM TFLOP/s and copies per device.
std::vector<Figure> Gpus(const std::string& model, const std::vector<double>& tflops, double copy_gbps = 50) {
  std::vector<Figure> out;
  for (std::size_t i = 0; i < tflops.size(); ++i) {
    out.push_back({"gpu_gemm_tflops:" + std::to_string(i), tflops[i], "", model});
    out.push_back({"gpu_h2d_gbps:" + std::to_string(i), copy_gbps, "", model});
  }
  return out;
}

TEST(DiagJudgeTest, AGpuBelowItsModelsFloorFailsEvenAlone) {
  // One node, two GPUs (too few to compare): the H100 at 120 TFLOP/s is broken.
  auto v = JudgeNodes({{"n0", Gpus("NVIDIA H100 80GB HBM3", {700, 120}, 12)}});
  ASSERT_FALSE(v[0].healthy);
  ASSERT_EQ(v[0].failures.size(), 3u);  // GPU 1's GEMM, both GPUs' copies (x8 or Gen3 speed)
  EXPECT_NE(v[0].failures[1].find("gpu_gemm_tflops:1 120 is below the floor 250 of the H100"), std::string::npos)
      << v[0].failures[1];
  EXPECT_NE(v[0].failures[0].find("gpu_h2d_gbps:0 12.00 is below the floor 20.00 of the H100"), std::string::npos)
      << v[0].failures[0];
  // The same figures from an A100 are healthy: its floors are its own.
  EXPECT_TRUE(JudgeNodes({{"n0", Gpus("NVIDIA A100-SXM4-80GB", {250, 240}, 12)}})[0].healthy);
  // A model nobody listed has no GPU floor.
  EXPECT_TRUE(JudgeNodes({{"n0", Gpus("NVIDIA GeForce RTX 4090", {90, 1}, 1)}})[0].healthy);
}

TEST(DiagJudgeTest, OneNodeFindsItsOneSlowGpuAmongItsOthers) {
  auto v = JudgeNodes({{"n0", Gpus("NVIDIA H100 80GB HBM3", {710, 700, 720, 380, 705, 715, 698, 702})}});
  ASSERT_FALSE(v[0].healthy);
  ASSERT_EQ(v[0].failures.size(), 1u);
  EXPECT_NE(v[0].failures[0].find("gpu_gemm_tflops:3 380 is 54 % of the median 705 of this node's 7 other "
                                  "NVIDIA H100 80GB HBM3 GPUs (min 70 %)"),
            std::string::npos)
      << v[0].failures[0];
  EXPECT_TRUE(WorthMeasuringAgain(v[0]));  // worth measuring again before evicting
  // Two GPUs: which one is slow? Neither fails against the other.
  EXPECT_TRUE(JudgeNodes({{"n0", Gpus("NVIDIA H100 80GB HBM3", {700, 380})}})[0].healthy);
}

TEST(DiagJudgeTest, GpusAreComparedAcrossNodesOnlyWithTheSameModel) {
  // Three H100 nodes and one A100 node: the A100s are not slow H100s.
  std::vector<NodeFigures> nodes = {{"h0", Gpus("NVIDIA H100 80GB HBM3", {700, 705})},
                                    {"h1", Gpus("NVIDIA H100 80GB HBM3", {690, 710})},
                                    {"h2", Gpus("NVIDIA H100 80GB HBM3", {420, 430})},
                                    {"a0", Gpus("NVIDIA A100-SXM4-80GB", {250, 255})}};
  auto v = JudgeNodes(nodes);
  EXPECT_TRUE(v[0].healthy);
  EXPECT_TRUE(v[1].healthy);
  ASSERT_FALSE(v[2].healthy);  // both its GPUs are at 61 % of the H100 nodes' median
  EXPECT_NE(v[2].failures[0].find("gpu_gemm_tflops:0 420 is 61 % of the median 690 of 3 nodes"), std::string::npos)
      << v[2].failures[0];
  EXPECT_TRUE(v[3].healthy) << (v[3].failures.empty() ? "" : v[3].failures[0]);
}

}  // namespace
}  // namespace trainguard
