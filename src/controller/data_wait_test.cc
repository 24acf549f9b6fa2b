#include "controller/data_wait.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

TEST(StepMaxSumTest, EachStepCountsItsLongestWaitOnce) {
  StepMaxSum s(4);
  s.Add(1, 100);
  s.Add(1, 300);  // another rank of step 1 waited longer
  s.Add(1, 50);
  s.Add(2, 10);
  s.Add(3, 0);    // no wait
  s.Add(4, -5);   // malformed: ignored
  EXPECT_DOUBLE_EQ(s.TotalUs(), 310);
}

TEST(StepMaxSumTest, OldStepsFoldAndALateReportOfOneIsNotCountedAgain) {
  StepMaxSum s(2);
  for (int step = 0; step < 10; ++step) s.Add(step, 10);
  EXPECT_DOUBLE_EQ(s.TotalUs(), 100);
  s.Add(3, 1000);  // folded long ago: its maximum is no longer known
  EXPECT_DOUBLE_EQ(s.TotalUs(), 100);
  s.Add(9, 25);    // still open: its maximum grows
  EXPECT_DOUBLE_EQ(s.TotalUs(), 115);
  s.Reset();
  EXPECT_DOUBLE_EQ(s.TotalUs(), 0);
  s.Add(3, 7);     // a new generation counts its steps afresh
  EXPECT_DOUBLE_EQ(s.TotalUs(), 7);
}

}  // namespace
}  // namespace trainguard
