// The SDC monitor as a component: what it decides from fingerprints and
// numeric reports, and what a successor (a restarted controller, a standby
// taking over) rebuilds from its events alone.
#include "controller/sdc_monitor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

namespace trainguard {
namespace {

using nlohmann::json;

constexpr Nanos kT0 = 1000 * kSecond;

// The job: which node holds each rank.
class FakeJob final : public SdcJob {
 public:
  std::map<int, std::string> node_of;
  std::map<std::string, int> history;
  std::int64_t max_step = -1;
  std::string NodeOfRank(int rank) const override {
    auto it = node_of.find(rank);
    return it == node_of.end() ? "" : it->second;
  }
  bool HasNode(const std::string& node) const override {
    for (const auto& [r, n] : node_of) {
      if (n == node) return true;
    }
    return false;
  }
  std::int64_t MaxStep() const override { return max_step; }
  int SdcHistory(const std::string& node) const override {
    auto it = history.find(node);
    return it == history.end() ? 0 : it->second;
  }
};

v1::RankStatus Prints(int rank, std::int64_t step, const std::vector<std::pair<std::int64_t, std::uint64_t>>& prints) {
  v1::RankStatus s;
  s.set_global_rank(rank);
  s.set_step(step);
  for (const auto& [at, value] : prints) {
    v1::Fingerprint* f = s.add_fingerprints();
    f->set_step(at);
    f->set_value(value);
  }
  return s;
}

class SdcMonitorTest : public ::testing::Test {
 protected:
  // Every rank reports `prints` (rank -> fingerprints); then a check, past the pacing.
  SdcActions Beat(SdcMonitor& m, const std::map<int, std::vector<std::pair<std::int64_t, std::uint64_t>>>& prints,
                  std::int64_t step) {
    SdcActions out;
    for (const auto& [rank, p] : prints) m.Observe(Prints(rank, step, p), &out);
    now_ += 300 * kMillisecond;
    job_.max_step = std::max(job_.max_step, step);
    m.Check(job_, now_, now_, /*after_heartbeat=*/true, &out);
    for (const SdcAction& a : out) {
      if (auto* e = std::get_if<SdcEvent>(&a)) recorded_.push_back(*e);
    }
    return out;
  }
  static std::vector<EventKind> Kinds(const SdcActions& out) {
    std::vector<EventKind> kinds;
    for (const SdcAction& a : out) {
      if (auto* e = std::get_if<SdcEvent>(&a)) kinds.push_back(e->kind);
    }
    return kinds;
  }
  static const SdcFailure* FailureOf(const SdcActions& out) {
    return out.empty() ? nullptr : std::get_if<SdcFailure>(&out.back());
  }
  // A successor that read the store: every event so far, replayed in order.
  SdcMonitor Successor(std::int64_t generation, int world) {
    SdcMonitor next("job", 1);
    json started = {{"restart_count", 0}};
    next.Replay(EventKind::kGenerationStarted, 0, -1, started);
    for (const SdcEvent& e : recorded_) {
      if (SdcMonitor::Replays(e.kind)) next.Replay(e.kind, 0, e.step, json::parse(e.detail_json));
    }
    if (generation > 0) next.Replay(EventKind::kGenerationStarted, generation, -1, started);
    next.FinishReplay(generation, world);
    return next;
  }

  FakeJob job_;
  Nanos now_ = kT0;
  std::vector<SdcEvent> recorded_;
};

TEST_F(SdcMonitorTest, AMinorityReplicaIsNamedRecordedAndEvictedAtOnce) {
  job_.node_of = {{0, "a"}, {1, "b"}, {2, "c"}};
  SdcMonitor m("job", 1);
  m.StartGeneration(0, 3);
  Beat(m, {{0, {{4, 1}, {8, 2}}}, {1, {{4, 1}, {8, 2}}}, {2, {{4, 1}, {8, 2}}}}, 8);
  EXPECT_EQ(Kinds(Beat(m, {}, 9)), std::vector<EventKind>{});  // nothing new
  SdcActions out = Beat(m, {{0, {{12, 5}}}, {1, {{12, 5}}}, {2, {{12, 6}}}}, 12);
  const SdcFailure* failure = FailureOf(out);
  ASSERT_NE(failure, nullptr);
  EXPECT_EQ(failure->finding.kind, FindingKind::kReplicaDivergence);
  EXPECT_EQ(failure->finding.rank, 2);
  ASSERT_TRUE(failure->finding.verdict.has_value());
  EXPECT_EQ(failure->finding.verdict->evict_nodes, std::vector<std::string>{"c"});
  ASSERT_FALSE(out.empty());
  auto* record = std::get_if<SdcNodeRecord>(&out[0]);
  ASSERT_NE(record, nullptr);
  EXPECT_TRUE(record->confirmed);
  EXPECT_EQ(record->nodes, std::vector<std::string>{"c"});
  EXPECT_NE(record->evidence_json.find("\"devices\":[\"c:0\"]"), std::string::npos) << record->evidence_json;
  EXPECT_EQ(m.resume_at_most(), 8);  // the last agreement
  EXPECT_EQ(m.suspicion_stage(), 0);  // a strict majority needs no replay
  v1::Start start;
  m.FillStart(&start);
  EXPECT_EQ(start.env().at("TRAINGUARD_RESUME_AT_MOST"), "8");
  // The sets were said once, before the divergence.
  EXPECT_EQ(recorded_.front().kind, EventKind::kReplicaSets);
}

TEST_F(SdcMonitorTest, ASuspicionUnderReplayContinuesInASuccessor) {
  job_.node_of = {{0, "a"}, {1, "b"}};
  SdcMonitor m("job", 1);
  m.StartGeneration(0, 2);
  Beat(m, {{0, {{4, 1}, {8, 2}}}, {1, {{4, 1}, {8, 2}}}}, 8);
  SdcActions out = Beat(m, {{0, {{12, 5}}}, {1, {{12, 6}}}}, 12);
  ASSERT_NE(FailureOf(out), nullptr);
  EXPECT_EQ(Kinds(out), (std::vector<EventKind>{EventKind::kReplicaDivergence, EventKind::kSdcSuspicion}));
  ASSERT_TRUE(std::holds_alternative<SdcReadHistory>(out[0]));
  EXPECT_EQ(std::get<SdcReadHistory>(out[0]).nodes, (std::vector<std::string>{"a", "b"}));

  // The controller dies; its successor has the events only. The replay generation starts.
  SdcMonitor next = Successor(1, 2);
  EXPECT_EQ(next.suspicion_what(), SdcWhat::kDisagreement);
  EXPECT_EQ(next.suspicion_stage(), 1);
  EXPECT_EQ(next.suspicion_step(), 12);
  EXPECT_EQ(next.resume_at_most(), 8);
  v1::Start start;
  next.FillStart(&start);
  EXPECT_EQ(start.env().at("TRAINGUARD_FINGERPRINT_AT"), "12");
  // On replay rank 1 now agrees with rank 0's first value: rank 1 computed wrong, once (transient).
  out = Beat(next, {{0, {{4, 1}, {8, 2}, {12, 5}}}, {1, {{4, 1}, {8, 2}, {12, 5}}}}, 12);
  EXPECT_EQ(FailureOf(out), nullptr);
  EXPECT_EQ(Kinds(out), (std::vector<EventKind>{EventKind::kReplicaSets, EventKind::kSdcConfirmation,
                                                EventKind::kSdcSuspicion}));
  const SdcEvent& decided = recorded_[recorded_.size() - 2];
  EXPECT_NE(decided.message.find("not reproduced"), std::string::npos) << decided.message;
  EXPECT_NE(decided.message.find("of rank 1 on b"), std::string::npos) << decided.message;
  EXPECT_EQ(next.suspicion_stage(), 0);
  // And a successor of the successor has nothing to confirm.
  EXPECT_EQ(Successor(2, 2).suspicion_stage(), 0);
}

TEST_F(SdcMonitorTest, AMovedSuspectIsRememberedAcrossASuccessor) {
  job_.node_of = {{0, "a"}, {1, "b"}};
  job_.history = {{"a", 1}};  // a had a confirmed corruption before: it is the one moved
  SdcMonitor m("job", 1);
  m.StartGeneration(0, 2);
  Beat(m, {{0, {{4, 1}, {8, 2}}}, {1, {{4, 1}, {8, 2}}}}, 8);
  ASSERT_NE(FailureOf(Beat(m, {{0, {{12, 5}}}, {1, {{12, 6}}}}, 12)), nullptr);
  m.StartGeneration(1, 2);
  SdcActions out = Beat(m, {{0, {{4, 1}, {8, 2}, {12, 5}}}, {1, {{4, 1}, {8, 2}, {12, 7}}}}, 12);
  const SdcFailure* failure = FailureOf(out);
  ASSERT_NE(failure, nullptr);
  EXPECT_EQ(failure->finding.verdict->evict_nodes, std::vector<std::string>{"a"});
  EXPECT_EQ(m.suspicion_stage(), 2);
  // The successor replays stage 2: without a, on a spare "s", the replicas still disagree: b is confirmed.
  SdcMonitor next = Successor(2, 2);
  EXPECT_EQ(next.suspicion_stage(), 2);
  job_.node_of = {{0, "s"}, {1, "b"}};
  out = Beat(next, {{0, {{4, 1}, {8, 2}, {12, 5}}}, {1, {{4, 1}, {8, 2}, {12, 8}}}}, 12);
  failure = FailureOf(out);
  ASSERT_NE(failure, nullptr);
  EXPECT_EQ(failure->finding.verdict->rule_id, "sdc-confirmed");
  EXPECT_EQ(failure->finding.verdict->evict_nodes, std::vector<std::string>{"b"});
  auto returned = std::find_if(out.begin(), out.end(), [](const SdcAction& a) {
    return std::holds_alternative<SdcReturnNode>(a);
  });
  ASSERT_NE(returned, out.end());
  EXPECT_EQ(std::get<SdcReturnNode>(*returned).node, "a");
}

TEST_F(SdcMonitorTest, ADamagedSuspicionRecordIsNotReplayed) {
  SdcMonitor m("job", 1);
  m.Replay(EventKind::kGenerationStarted, 0, -1, json::object());
  m.Replay(EventKind::kSdcSuspicion, 0, 12, json{{"what", "disagreement"}, {"stage", 1}, {"ranks", "not a list"}});
  EXPECT_EQ(m.suspicion_stage(), 0);
  m.Replay(EventKind::kSdcSuspicion, 0, 12, json{{"what", "something newer"}, {"stage", 1}, {"step", 3}, {"ranks", {1}}});
  EXPECT_EQ(m.suspicion_stage(), 0);
  m.Replay(EventKind::kSdcSuspicion, 0, 12, json{{"what", "numeric"}, {"stage", 1}, {"step", 3}, {"ranks", {1}}});
  EXPECT_EQ(m.suspicion_stage(), 1);
  m.Replay(EventKind::kSdcSuspicion, 0, 12, json{{"what", ""}, {"stage", 0}});  // decided since
  EXPECT_EQ(m.suspicion_stage(), 0);
}

}  // namespace
}  // namespace trainguard
