#include "diag/probes.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "diag/suite.h"

namespace trainguard {
namespace {

TEST(DiagProbesTest, ComputeAndMemoryMeasureAPositiveRate) {
  Figure c = MeasureCompute(100 * kMillisecond, 20 * kMillisecond);
  EXPECT_EQ(c.name, "compute_gflops");
  EXPECT_TRUE(c.error.empty());
  EXPECT_GT(c.value, 0);
  Figure m = MeasureMemory(100 * kMillisecond, 20 * kMillisecond);
  EXPECT_EQ(m.name, "memory_gbps");
  EXPECT_GT(m.value, 0);
}

TEST(DiagProbesTest, AHealthyCpuComputesTheKnownAnswerExactly) {
  Figure k = CheckKnownAnswer();
  EXPECT_EQ(k.name, "gemm_known_answer_mismatches");
  EXPECT_TRUE(k.error.empty());
  EXPECT_EQ(k.value, 0);
}

TEST(DiagProbesTest, ABudgetShorterThanAWindowStillMeasures) {
  EXPECT_GT(MeasureCompute(1 * kMillisecond, 1000 * kMillisecond).value, 0);
}

TEST(DiagProbesTest, DiskFiguresAreNamedByRoleAndLeaveNoFileBehind) {
  auto dir = std::filesystem::temp_directory_path() / ("tg-diag-probe-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto figures = MeasureDisk("checkpoint", dir.string(), 4 << 20);
  ASSERT_EQ(figures.size(), 3u);
  EXPECT_EQ(figures[0].name, "disk_write_mbps:checkpoint");
  EXPECT_EQ(figures[1].name, "disk_read_mbps:checkpoint");
  EXPECT_EQ(figures[2].name, "disk_free_gib:checkpoint");
  for (const auto& f : figures) {
    EXPECT_TRUE(f.error.empty()) << f.name << ": " << f.error;
    EXPECT_GT(f.value, 0) << f.name;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(DiagProbesTest, AMissingDirectoryIsAFindingThatNamesThePath) {
  auto figures = MeasureDisk("scratch", "/nonexistent/tg-diag", 1 << 20);
  ASSERT_EQ(figures.size(), 3u);
  for (const auto& f : figures) EXPECT_FALSE(f.error.empty()) << f.name;
  EXPECT_NE(figures[0].error.find("/nonexistent/tg-diag"), std::string::npos) << figures[0].error;
}

TEST(DiagSuiteTest, FiguresRoundTripThroughJsonAndBadTextIsNamed) {
  std::vector<Figure> figures = {{"compute_gflops", 2.5, ""}, {"disk_write_mbps:checkpoint", 0, "write: No space left"}};
  auto back = FiguresFromJson(FiguresToJson(figures));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].name, "compute_gflops");
  EXPECT_DOUBLE_EQ((*back)[0].value, 2.5);
  EXPECT_EQ((*back)[1].error, "write: No space left");
  EXPECT_FALSE(FiguresFromJson("{\"name\": 1}").ok());
  EXPECT_FALSE(FiguresFromJson("[{\"name\": \"x\"}]").ok());
  EXPECT_FALSE(FiguresFromJson("[{\"name\": \"x\", \"v").ok());
}

}  // namespace
}  // namespace trainguard
