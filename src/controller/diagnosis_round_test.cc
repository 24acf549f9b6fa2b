#include "controller/diagnosis_round.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

std::vector<Figure> Compute(double gflops) { return {{"compute_gflops", gflops, ""}}; }

TEST(DiagnosisRoundTest, AsksOneNodeAtATimeWhenNodesShareAHost) {
  DiagnosisRound round(1, "incident 1", {"n0", "n1", "n2"}, 1, 10 * kSecond);
  EXPECT_EQ(round.NextToAsk(0), std::vector<std::string>{"n0"});
  EXPECT_TRUE(round.NextToAsk(0).empty());  // n0 still runs
  EXPECT_FALSE(round.Answer("n1", Compute(2)));  // not asked yet
  EXPECT_TRUE(round.Answer("n0", Compute(2)));
  EXPECT_FALSE(round.Answer("n0", Compute(2)));  // answered already
  EXPECT_EQ(round.NextToAsk(1), std::vector<std::string>{"n1"});
  EXPECT_TRUE(round.Answer("n1", Compute(1)));
  EXPECT_EQ(round.NextToAsk(2), std::vector<std::string>{"n2"});
  EXPECT_FALSE(round.Done());
  EXPECT_TRUE(round.Answer("n2", Compute(2.1)));
  EXPECT_TRUE(round.Done());
  auto verdicts = round.Judge({});
  ASSERT_EQ(verdicts.size(), 3u);
  EXPECT_TRUE(verdicts[0].healthy);
  EXPECT_FALSE(verdicts[1].healthy);  // half the median of 3
  EXPECT_TRUE(verdicts[2].healthy);
  // Below the median only: every node is measured once more, each judged on its better run.
  EXPECT_EQ(round.QueueConfirmations({}), (std::vector<std::string>{"n0", "n1", "n2"}));
  EXPECT_FALSE(round.Done());
  EXPECT_EQ(round.NextToAsk(3), std::vector<std::string>{"n0"});
  EXPECT_TRUE(round.Answer("n0", Compute(1.8)));
  EXPECT_EQ(round.NextToAsk(3), std::vector<std::string>{"n1"});
  EXPECT_TRUE(round.Answer("n1", Compute(0.9)));
  EXPECT_EQ(round.NextToAsk(3), std::vector<std::string>{"n2"});
  EXPECT_TRUE(round.Answer("n2", Compute(2.2)));
  EXPECT_TRUE(round.Done());
  // Still slow against the settled median: one more chance, for it alone.
  EXPECT_EQ(round.QueueConfirmations({}), std::vector<std::string>{"n1"});
  EXPECT_EQ(round.NextToAsk(4), std::vector<std::string>{"n1"});
  EXPECT_TRUE(round.Answer("n1", Compute(0.95)));
  EXPECT_TRUE(round.QueueConfirmations({}).empty());  // three runs at most
  verdicts = round.Judge({});
  EXPECT_FALSE(verdicts[1].healthy);  // slow twice
  EXPECT_DOUBLE_EQ(round.FiguresOf("n1")->at(0).value, 1.0);
  EXPECT_DOUBLE_EQ(round.FiguresOf("n0")->at(0).value, 2.0);
  EXPECT_DOUBLE_EQ(round.FiguresOf("n2")->at(0).value, 2.2);
}

TEST(DiagnosisRoundTest, ASlowSpellOfTheSharedHostIsMeasuredAwayForEveryone) {
  // n1 is throttled; n2 was measured while the shared host was slow.
  DiagnosisRound round(6, "incident 1", {"n0", "n1", "n2", "n3"}, 1, 10 * kSecond);
  const double first[] = {30, 15, 15, 30}, second[] = {29, 14, 30, 31};
  for (int i = 0; i < 4; ++i) {
    auto asked = round.NextToAsk(i);
    ASSERT_EQ(asked.size(), 1u);
    round.Answer(asked[0], Compute(first[i]));
  }
  ASSERT_EQ(round.QueueConfirmations({}).size(), 4u);
  for (int i = 0; i < 4; ++i) {
    auto asked = round.NextToAsk(10 + i);
    ASSERT_EQ(asked.size(), 1u);
    round.Answer(asked[0], Compute(second[i]));
  }
  ASSERT_EQ(round.QueueConfirmations({}), std::vector<std::string>{"n1"});
  round.Answer(round.NextToAsk(20).at(0), Compute(15));
  ASSERT_TRUE(round.Done());
  auto verdicts = round.Judge({});
  EXPECT_TRUE(verdicts[0].healthy);
  EXPECT_FALSE(verdicts[1].healthy);  // 15 of a median of 30
  EXPECT_TRUE(verdicts[2].healthy);
  EXPECT_TRUE(verdicts[3].healthy);
}

TEST(DiagnosisRoundTest, ANodeSlowOnlyOnceIsNotFailed) {
  DiagnosisRound round(4, "incident 1", {"n0", "n1", "n2"}, 0, 10 * kSecond);
  round.NextToAsk(0);
  round.Answer("n0", Compute(2));
  round.Answer("n1", Compute(1));  // a neighbour's burst
  round.Answer("n2", Compute(2));
  EXPECT_EQ(round.QueueConfirmations({}).size(), 3u);
  EXPECT_EQ(round.NextToAsk(1).size(), 3u);  // all at once
  round.Answer("n0", Compute(1.7));
  round.Answer("n1", Compute(1.9));
  round.Answer("n2", Compute(2));
  EXPECT_TRUE(round.Done());
  for (const auto& v : round.Judge({})) EXPECT_TRUE(v.healthy) << v.node;
}

TEST(DiagnosisRoundTest, AnErrorIsNotMeasuredAgain) {
  DiagnosisRound round(5, "preflight", {"n0", "n1", "n2"}, 0, 10 * kSecond);
  round.NextToAsk(0);
  round.Answer("n0", Compute(2));
  round.Answer("n1", {{"compute_gflops", 2, ""}, {"disk_write_mbps:c", 0, "No space left on device"}});
  round.Answer("n2", {{"compute_gflops", 2, ""}, {"disk_free_gib:c", 0.2, ""}});  // below the free-space floor
  EXPECT_TRUE(round.QueueConfirmations({}).empty());
  EXPECT_TRUE(round.Done());
}

TEST(DiagnosisRoundTest, ANodeDiagnosedAloneBelowASpeedFloorIsMeasuredTwiceMore) {
  DiagnosisRound round(6, "incident 3", {"n1"}, 1, 10 * kSecond);
  round.NextToAsk(0);
  round.Answer("n1", Compute(0.031));  // starved by a busy host, not broken
  EXPECT_FALSE(round.Judge({})[0].healthy);
  EXPECT_EQ(round.QueueConfirmations({}), std::vector<std::string>{"n1"});
  EXPECT_EQ(round.NextToAsk(1), std::vector<std::string>{"n1"});
  round.Answer("n1", Compute(0.04));
  EXPECT_EQ(round.QueueConfirmations({}), std::vector<std::string>{"n1"});  // the third run
  round.NextToAsk(2);
  round.Answer("n1", Compute(18));
  EXPECT_TRUE(round.QueueConfirmations({}).empty());
  EXPECT_TRUE(round.Judge({})[0].healthy);  // the best of its three runs
  // A node that is broken stays below the floor in every run, and fails.
  DiagnosisRound broken(7, "incident 4", {"n2"}, 1, 10 * kSecond);
  for (int run = 0; run < 3; ++run) {
    broken.NextToAsk(run);
    broken.Answer("n2", Compute(0.02));
    broken.QueueConfirmations({});
  }
  EXPECT_TRUE(broken.Done());
  EXPECT_FALSE(broken.Judge({})[0].healthy);
}

TEST(DiagnosisRoundTest, ANodeThatDoesNotAnswerInTimeOrGoesAwayFails) {
  DiagnosisRound round(2, "preflight", {"n0", "n1", "n2", "n3"}, 0, 10 * kSecond);
  EXPECT_EQ(round.NextToAsk(0).size(), 4u);  // all at once
  round.Answer("n0", Compute(2));
  round.Answer("n2", Compute(2));
  round.NodeGone("n3", "its agent went away");
  round.NodeGone("n9", "not in the round");
  round.CheckTimeouts(5 * kSecond);
  EXPECT_FALSE(round.Done());
  round.CheckTimeouts(11 * kSecond);
  EXPECT_TRUE(round.Done());
  auto verdicts = round.Judge({});
  ASSERT_EQ(verdicts.size(), 4u);
  EXPECT_TRUE(verdicts[0].healthy);
  EXPECT_FALSE(verdicts[1].healthy);
  EXPECT_EQ(verdicts[1].failures, std::vector<std::string>{"no diagnostics within 10 s"});
  EXPECT_TRUE(verdicts[2].healthy);  // two answers: floors only
  EXPECT_EQ(verdicts[3].failures, std::vector<std::string>{"its agent went away"});
  EXPECT_FALSE(round.Answer("n1", Compute(2)));  // too late
}

TEST(DiagnosisRoundTest, ANodeGoneBeforeItWasAskedIsSkipped) {
  DiagnosisRound round(3, "incident 2", {"n0", "n1"}, 1, 10 * kSecond);
  EXPECT_EQ(round.NextToAsk(0), std::vector<std::string>{"n0"});
  round.NodeGone("n1", "lost");
  round.Answer("n0", Compute(2));
  EXPECT_TRUE(round.NextToAsk(1).empty());
  EXPECT_TRUE(round.Done());
}

TEST(RingNeighboursTest, TwoOnEachSideNearestFirstFewerInASmallRing) {
  using V = std::vector<std::size_t>;
  EXPECT_EQ(RingNeighbours(8, 0), (V{7, 1, 6, 2}));
  EXPECT_EQ(RingNeighbours(8, 5), (V{4, 6, 3, 7}));
  EXPECT_EQ(RingNeighbours(4, 2), (V{1, 3, 0}));  // the node opposite is two away both ways: once
  EXPECT_EQ(RingNeighbours(3, 1), (V{0, 2}));
  EXPECT_EQ(RingNeighbours(2, 0), (V{1}));
  EXPECT_EQ(RingNeighbours(1, 0), V{});
  EXPECT_EQ(RingNeighbours(4, 4), V{});  // not in the ring
}

}  // namespace
}  // namespace trainguard
