#include "common/stats.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

TEST(MedianTest, OddEvenAndNone) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);  // the mean of the two middle values
  EXPECT_EQ(Median({5, 5, 1, 5}), 5);
  EXPECT_EQ(Median({-1, -3}), -2);
}

}  // namespace
}  // namespace trainguard
