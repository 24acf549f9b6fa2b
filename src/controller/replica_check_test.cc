#include "controller/replica_check.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace trainguard {
namespace {

// Four DDP replicas report the same value at each step; `bad` reports
// another one from `from` on.
void Report(ReplicaCheck* c, std::int64_t step, int world, int bad = -1, std::int64_t from = 1 << 30) {
  for (int r = 0; r < world; ++r) c->Add(r, step, static_cast<std::uint64_t>(step) * 7 + (r == bad && step >= from));
}

TEST(ReplicaCheckTest, AMinorityAmongFourReplicasIsNamedWithTheLastStepTheyAgreed) {
  ReplicaCheck c(4);
  for (std::int64_t s = 8; s <= 40; s += 8) Report(&c, s, 4, 2, 32);
  auto found = c.Evaluate();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].step, 32);
  EXPECT_EQ(found[0].last_agreed_step, 24);
  EXPECT_EQ(found[0].diverged, std::vector<int>{2});
  EXPECT_EQ(found[0].replicas, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(c.Evaluate().empty()) << "reported once";
}

// The sets of 100,000 ranks (TP 8 x DP 12,500) are a few numbers each, and
// read back as they were; any other set is its list; bad input is refused.
TEST(ReplicaCheckTest, SetsAreWrittenSmallAtAnySizeAndReadBackTheSame) {
  std::vector<std::vector<int>> sets(8);
  for (int r = 0; r < 100000; ++r) sets[r % 8].push_back(r);
  sets.push_back({3, 5, 11});  // not a progression
  const nlohmann::json j = ReplicaSetsJson(sets);
  EXPECT_LT(j.dump().size(), 500u);
  EXPECT_EQ(j[1], (nlohmann::json{{"first", 1}, {"stride", 8}, {"count", 12500}}));
  EXPECT_EQ(j[8], (nlohmann::json{3, 5, 11}));
  EXPECT_EQ(ReplicaSetsFromJson(j), sets);
  EXPECT_EQ(ReplicaSetsFromJson(nlohmann::json::parse("[[0, 1, 2, 3]]")), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  for (const char* bad : {R"({"first": 0})", R"([{"first": 0, "stride": 0, "count": 4}])",
                          R"([{"first": 0, "stride": 1, "count": 1e12}])", R"([{"first": 0, "count": 4}])",
                          R"([["a"]])", R"([{"first": -1, "stride": 1, "count": 2}])"}) {
    EXPECT_FALSE(ReplicaSetsFromJson(nlohmann::json::parse(bad)).has_value()) << bad;
  }
}

TEST(ReplicaCheckTest, TwoReplicasDisagreeWithoutACulprit) {
  ReplicaCheck c(2);
  for (std::int64_t s = 4; s <= 16; s += 4) Report(&c, s, 2, 1, 12);
  auto found = c.Evaluate();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].diverged.empty());
  EXPECT_EQ(found[0].last_agreed_step, 8);
}

TEST(ReplicaCheckTest, RestoredSetsAreComparedFromTheNextStepWithoutLearningAgain) {
  ReplicaCheck c(4);
  EXPECT_FALSE(c.Restore({{0, 4}}, 16)) << "rank 4 is outside the world";
  EXPECT_FALSE(c.Restore({{0}}, 16)) << "one rank is no set";
  EXPECT_TRUE(c.replica_sets().empty());
  ASSERT_TRUE(c.Restore({{0, 2}, {1, 3}}, 16));
  EXPECT_EQ(c.AgreedThrough(), 16);
  // One step after the restore is compared at once: no two steps to learn from.
  for (int r = 0; r < 4; ++r) c.Add(r, 24, static_cast<std::uint64_t>(240 + r % 2 + (r == 3) * 100));
  auto found = c.Evaluate();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].replicas, (std::vector<int>{1, 3}));
  EXPECT_EQ(found[0].last_agreed_step, 16);
  EXPECT_EQ(c.replica_sets(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
}

TEST(ReplicaCheckTest, ShardsThatNeverAgreeAreNeverCompared) {
  ReplicaCheck c(4);  // FSDP-like: every rank holds other bytes
  for (std::int64_t s = 1; s <= 20; ++s) {
    for (int r = 0; r < 4; ++r) c.Add(r, s, static_cast<std::uint64_t>(s * 10 + r));
  }
  EXPECT_TRUE(c.Evaluate().empty());
  EXPECT_TRUE(c.replica_sets().empty());
}

TEST(ReplicaCheckTest, DataParallelPeersOfATensorParallelLayoutAreTheSets) {
  ReplicaCheck c(4);  // tp2 x dp2: ranks 0,2 hold one shard, 1,3 the other
  auto report = [&](std::int64_t s, bool flip) {
    for (int r = 0; r < 4; ++r) c.Add(r, s, static_cast<std::uint64_t>(s * 10 + r % 2 + (flip && r == 3) * 100));
  };
  for (std::int64_t s = 2; s <= 8; s += 2) report(s, false);
  EXPECT_TRUE(c.Evaluate().empty());
  EXPECT_EQ(c.replica_sets(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  report(10, true);
  auto found = c.Evaluate();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].replicas, (std::vector<int>{1, 3}));
  EXPECT_TRUE(found[0].diverged.empty()) << "two replicas: no majority";
}

TEST(ReplicaCheckTest, StepsNotReportedByEveryMemberAreNotCompared) {
  ReplicaCheck c(3);
  for (std::int64_t s = 1; s <= 3; ++s) Report(&c, s, 3);
  c.Add(0, 4, 1);  // only rank 0 has step 4 (the others' heartbeats are late)
  EXPECT_TRUE(c.Evaluate().empty());
  c.Add(1, 4, 28);
  c.Add(2, 4, 28);
  auto found = c.Evaluate();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].diverged, std::vector<int>{0});
}

TEST(ReplicaCheckTest, MemoryIsBoundedAndBadInputIgnored) {
  ReplicaCheck c(2);
  for (std::int64_t s = 0; s < 1000; ++s) Report(&c, s, 2);
  c.Add(-1, 5, 1);
  c.Add(7, 5, 1);
  c.Add(0, 3, 99);  // older than what it holds
  EXPECT_TRUE(c.Evaluate().empty());
  c.Reset(2);
  EXPECT_TRUE(c.replica_sets().empty());
}

}  // namespace
}  // namespace trainguard
