#include "controller/numeric_check.h"

#include <gtest/gtest.h>

#include <cmath>

namespace trainguard {
namespace {

constexpr Nanos kT0 = 1000 * kSecond;

TEST(NumericCheck, ANanOnEveryRankIsTheJobs) {
  NumericCheck c;
  c.Reset(4);
  for (int r = 0; r < 4; ++r) c.Observe(r, 11, 12);
  for (int r = 0; r < 3; ++r) c.Flag(r, false, 12, 1, NAN);
  EXPECT_TRUE(c.Evaluate(kT0).empty());  // rank 3 has not finished step 12: it may flag it yet
  c.Flag(3, false, 12, 1, NAN);
  auto found = c.Evaluate(kT0 + kSecond);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].all);
  EXPECT_FALSE(found[0].spike);
  EXPECT_EQ(found[0].step, 12);
  EXPECT_EQ(found[0].observers, 4);
  EXPECT_TRUE(c.Evaluate(kT0 + 2 * kSecond).empty());  // once per generation
}

TEST(NumericCheck, ANanOnOneRankNamesItAndItsConsequencesOnTheOthersDoNot) {
  NumericCheck c;
  c.Reset(4);
  for (int r = 0; r < 4; ++r) c.Observe(r, 30, 31);
  c.Flag(2, false, 31, 1, NAN);
  for (int r : {0, 1, 3}) c.Flag(r, false, 32, 1, NAN);  // the all-reduce spread it to them a step later
  EXPECT_TRUE(c.Evaluate(kT0).empty());  // nobody has finished step 31 yet
  for (int r = 0; r < 4; ++r) c.Observe(r, 31, 32);
  auto found = c.Evaluate(kT0 + kSecond);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_FALSE(found[0].all);
  EXPECT_EQ(found[0].Ranks(), std::vector<int>{2});
  EXPECT_EQ(found[0].flagged.at(2).first, 1);
}

TEST(NumericCheck, ARankNotHeardFromSinceBeforeTheStepIsWaitedFor) {
  NumericCheck c;
  c.Reset(4);
  c.Observe(0, 49, 50);
  c.Observe(1, 49, 50);
  c.Flag(0, false, 50, 1, NAN);
  c.Flag(1, false, 50, 1, NAN);
  EXPECT_TRUE(c.Evaluate(kT0).empty());  // ranks 2 and 3 (another node) have not reported yet
  c.Observe(2, 49, 50);
  c.Observe(3, 49, 50);
  c.Flag(2, false, 50, 1, NAN);
  c.Flag(3, false, 50, 1, NAN);
  auto found = c.Evaluate(kT0 + kSecond);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].all);
  EXPECT_EQ(found[0].observers, 4);
}

TEST(NumericCheck, OnlyRanksThatCheckALossAreCompared) {
  // A pipeline: only the last stage computes the loss.
  NumericCheck c;
  c.Reset(4);
  c.Observe(0, 10, 0);
  c.Observe(1, 10, 0);
  c.Observe(2, 9, 10);
  c.Observe(3, 9, 10);
  c.Flag(2, false, 10, 1, INFINITY);
  c.Flag(3, false, 10, 1, INFINITY);
  auto found = c.Evaluate(kT0);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].all);
  EXPECT_EQ(found[0].observers, 2);
}

TEST(NumericCheck, ARankThatNeitherFlagsNorStepsIsWaitedForAGraceTimeOnly) {
  NumericCheck c;
  c.Reset(2);
  c.Observe(0, 4, 5);
  c.Observe(1, 3, 4);  // stuck before step 5
  c.Flag(0, false, 5, 1, NAN);
  EXPECT_TRUE(c.Evaluate(kT0).empty());
  EXPECT_TRUE(c.Evaluate(kT0 + NumericCheck::kGrace - kSecond).empty());
  auto found = c.Evaluate(kT0 + NumericCheck::kGrace);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_FALSE(found[0].all);
  EXPECT_EQ(found[0].Ranks(), std::vector<int>{0});
}

TEST(NumericCheck, SpikesAreJudgedApartFromNans) {
  NumericCheck c;
  c.Reset(2);
  c.Observe(0, 200, 201);
  c.Observe(1, 200, 201);
  c.Flag(1, true, 150, 3, 42.0);
  auto found = c.Evaluate(kT0);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].spike);
  EXPECT_EQ(found[0].Ranks(), std::vector<int>{1});
  EXPECT_FALSE(found[0].all);
  c.Flag(0, false, 201, 1, NAN);  // a NaN later is judged on its own
  c.Observe(1, 201, 202);
  found = c.Evaluate(kT0 + kSecond);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_FALSE(found[0].spike);
  EXPECT_EQ(found[0].Ranks(), std::vector<int>{0});
}

TEST(NumericCheck, AReplayPassesCleanOnlyOnceEveryObserverFinishedTheStep) {
  NumericCheck c;
  c.Reset(2);
  c.Observe(0, 12, 3);
  c.Observe(1, 11, 3);
  EXPECT_FALSE(c.PassedClean(12, kT0));
  c.Observe(1, 12, 4);
  EXPECT_TRUE(c.PassedClean(12, kT0 + kSecond));
  c.Flag(0, false, 12, 1, NAN);
  EXPECT_FALSE(c.PassedClean(12, kT0 + 2 * kSecond));
  NumericCheck d;
  d.Reset(2);
  EXPECT_FALSE(d.PassedClean(0, kT0));  // nobody checks a loss: nothing is known
}

TEST(NumericCheck, BadRanksAndStepsAreIgnored) {
  NumericCheck c;
  c.Reset(2);
  c.Flag(-1, false, 3, 1, NAN);
  c.Flag(7, false, 3, 1, NAN);
  c.Flag(0, false, -1, 1, NAN);
  c.Observe(9, 3, 3);
  EXPECT_TRUE(c.Evaluate(kT0 + kSecond).empty());
}

}  // namespace
}  // namespace trainguard
