#include "attribution/log_structure.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

std::vector<LogLine> Lines(std::vector<std::string> texts) {
  std::vector<LogLine> out;
  for (auto& t : texts) out.push_back({-1, "", t});
  return out;
}

TEST(LogStructureTest, TracebackFramesAndQuotedSourceAreToldFromTheException) {
  auto st = ParseLogStructure(Lines({
      "[rank1]: Traceback (most recent call last):",
      "[rank1]:   File \"/lustre/home/u/train.py\", line 12, in <module>",
      "[rank1]:     if torch.isnan(loss): raise ValueError('loss is nan')",
      "[rank1]:                          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
      "[rank1]: KeyError: 'labels'",
      "after the traceback",
  }));
  EXPECT_EQ(st.lines[0].kind, LineKind::kTracebackStart);
  EXPECT_EQ(st.lines[1].kind, LineKind::kPythonFrame);
  EXPECT_EQ(st.lines[2].kind, LineKind::kQuotedSource);
  EXPECT_EQ(st.lines[3].kind, LineKind::kQuotedSource);
  EXPECT_EQ(st.lines[4].kind, LineKind::kException);
  EXPECT_EQ(st.lines[5].kind, LineKind::kText);
  EXPECT_EQ(st.lines[4].rank, 1);
  ASSERT_EQ(st.exceptions.size(), 1u);
  EXPECT_EQ(st.exceptions[0].type, "KeyError");
}

TEST(LogStructureTest, ChainedExceptionsKnowWhichCausedWhich) {
  auto st = ParseLogStructure(Lines({
      "Traceback (most recent call last):",
      "  File \"a.py\", line 1, in f",
      "    g()",
      "torch.cuda.OutOfMemoryError: CUDA out of memory.",
      "",
      "The above exception was the direct cause of the following exception:",
      "",
      "Traceback (most recent call last):",
      "  File \"b.py\", line 2, in h",
      "    f()",
      "RuntimeError: step failed",
  }));
  ASSERT_EQ(st.exceptions.size(), 2u);
  EXPECT_EQ(st.exceptions[0].type, "torch.cuda.OutOfMemoryError");
  EXPECT_TRUE(st.exceptions[0].caused_others);
  EXPECT_EQ(st.exceptions[1].type, "RuntimeError");
  EXPECT_FALSE(st.exceptions[1].caused_others);
  EXPECT_EQ(st.lines[5].kind, LineKind::kChainMarker);
}

TEST(LogStructureTest, CxxFramesAreMatchedOnTheirSymbolNotTheirLibraryPath) {
  auto st = ParseLogStructure(Lines({
      "frame #4: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
      "std::ratio<1l, 1000l> > >) + 0x1f2 (0x7f3c in /lustre/envs/torch/lib/libtorch_cuda.so)",
  }));
  EXPECT_EQ(st.lines[0].kind, LineKind::kCxxFrame);
  EXPECT_EQ(st.lines[0].match_text.find("/lustre"), std::string::npos);
  EXPECT_NE(st.lines[0].match_text.find("WorkNCCL::checkTimeout"), std::string::npos);
}

TEST(LogStructureTest, TorchrunsSummaryNamesTheRankOfItsBlocksAndTheRootCause) {
  auto st = ParseLogStructure(Lines({
      "Failures:",
      "[1]:",
      "  time      : 2022-11-29_17:14:20",
      "  host      : GPU236",
      "  rank      : 5 (local_rank: 1)",
      "  exitcode  : -9 (pid: 49149)",
      "  error_file: <N/A>",
      "------------------------------------------------------------",
      "Root Cause (first observed failure):",
      "[0]:",
      "  time      : 2022-11-29_17:14:19",
      "  host      : GPU236",
      "  rank      : 3 (local_rank: 3)",
      "  exitcode  : 1 (pid: 49151)",
      "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
  }));
  EXPECT_EQ(st.lines[5].rank, 5);   // exitcode -9 belongs to rank 5
  EXPECT_EQ(st.lines[2].rank, 5);
  EXPECT_EQ(st.lines[13].rank, 3);
  EXPECT_EQ(st.launcher_root_rank, 3);
}

}  // namespace
}  // namespace trainguard
