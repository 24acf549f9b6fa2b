// Blame and the recovery policy on hand-made incidents.
#include "controller/recovery_policy.h"

#include <gtest/gtest.h>

#include "controller/fleet_history.h"

namespace trainguard {
namespace {

std::string NodeOf(int rank) { return "node" + std::to_string(rank / 2); }

FleetFinding HardwareHistory(std::map<std::string, int> counts) {
  FleetFinding f;
  f.hardware_on_node = std::move(counts);
  return f;
}

Incident Hang(std::vector<int> hung, int first_rank) {
  Incident inc;
  inc.number = 1;
  inc.kind = FindingKind::kHang;
  inc.hung_ranks = std::move(hung);
  inc.first_rank = first_rank;
  inc.first_node = NodeOf(first_rank);
  inc.failure_step = 10;
  return inc;
}

TEST(BlameTest, AHangBlamesTheStoppedProcess) {
  Incident inc = Hang({0, 1, 2, 3}, 0);
  inc.stacks[0] = {"S", "File \"torch/distributed/distributed_c10d.py\", in all_reduce"};
  inc.stacks[3] = {"T", ""};
  Blame b = AssignBlame(nullptr, inc, NodeOf);
  EXPECT_EQ(b.culprit_ranks, std::vector<int>{3});
  EXPECT_EQ(b.culprit_node, "node1");
  EXPECT_EQ(b.CulpritText(), "rank 3 on node1");
}

TEST(BlameTest, AHangBlamesTheRankOutsideAnyCollectiveWhileOthersWaitInOne) {
  Incident inc = Hang({0, 1, 2}, 0);
  inc.stacks[0] = {"S", "File \"torch/distributed/distributed_c10d.py\", in all_reduce"};
  inc.stacks[1] = {"S", "File \"train.py\", line 40 in load_batch"};
  inc.stacks[2] = {"S", "File \"torch/autograd/__init__.py\", in backward"};
  Blame b = AssignBlame(nullptr, inc, NodeOf);
  EXPECT_EQ(b.culprit_ranks, std::vector<int>{1});
  EXPECT_EQ(b.culprit_nodes, (std::set<std::string>{"node0"}));
}

TEST(BlameTest, WithoutStacksTheHangDetectorsCulpritStandsWhereItsEvidenceSetsItApart) {
  Incident inc = Hang({0, 1, 2, 3}, 2);
  inc.hang_evidence = "rank 2 is outside any communication (phase 'data') while 3 rank(s) wait in one";
  Blame b = AssignBlame(nullptr, inc, NodeOf);
  EXPECT_EQ(b.culprit_rank, 2);
  EXPECT_EQ(b.culprit_node, "node1");
  EXPECT_EQ(b.culprit_evidence, inc.hang_evidence);
}

TEST(BlameTest, AHangWhereNoRankStandsOutNamesNoCulpritRatherThanTheOneNoticedFirst) {
  Incident inc = Hang({0, 1, 2, 3}, 2);
  for (int r = 0; r < 4; ++r) inc.stacks[r] = {"S", "File \"torch/autograd/__init__.py\", in backward"};
  Blame b = AssignBlame(nullptr, inc, NodeOf);
  EXPECT_TRUE(b.culprit_ranks.empty());
  EXPECT_TRUE(b.culprit_nodes.empty());
  EXPECT_EQ(b.CulpritText(), "unknown");
  EXPECT_NE(b.culprit_evidence.find("no rank stands out"), std::string::npos);
  // With a node under suspicion, nothing is evicted: no node is named.
  RecoveryPolicy policy(3);
  Verdict v = policy.Decide(b, inc, HardwareHistory({{"node1", 2}}));
  EXPECT_EQ(v.decision, Decision::kRestart) << v.why;
  EXPECT_TRUE(v.evict_nodes.empty());
}

TEST(BlameTest, AHangsCulpritNodesAreTheCulpritRanksOwnThoughEveryNodeLoggedTimeouts) {
  auto rules = RuleSet::Load(TG_RULES_FILE);
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  Incident inc = Hang({0, 1, 2, 3}, 0);
  for (int r : {0, 2, 3}) {
    inc.AddLine({r, NodeOf(r), "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                               "Timed out waiting 1800000ms for recv operation to complete"});
    inc.stacks[r] = {"S", "File \"torch/autograd/__init__.py\", in backward"};
  }
  inc.stacks[1] = {"S", "File \"train.py\", line 40 in load_batch"};
  Blame b = AssignBlame(&*rules, inc, NodeOf);
  EXPECT_EQ(b.attribution.category, "comm_hang");
  EXPECT_EQ(b.culprit_ranks, std::vector<int>{1});
  EXPECT_EQ(b.culprit_nodes, (std::set<std::string>{"node0"}));
  EXPECT_NE(b.culprit_evidence.find("rank(s) 1 is outside any collective while rank(s) 0, 2, 3 wait"),
            std::string::npos) << b.culprit_evidence;
}

TEST(BlameTest, TheCulpritsOwnStepIsTheFailureStep) {
  Incident inc;
  inc.kind = FindingKind::kRankFailed;
  inc.first_rank = 1;
  inc.first_rank_step = 17;
  inc.failure_step = 19;
  EXPECT_EQ(AssignBlame(nullptr, inc, NodeOf).step, 17);
  inc.rank_steps[1] = 18;
  EXPECT_EQ(AssignBlame(nullptr, inc, NodeOf).step, 18);
}

TEST(BlameTest, TheFirstFailureInTimeOutweighsPeersSymptoms) {
  auto rules = RuleSet::Load(TG_RULES_FILE);
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  Incident inc;
  inc.kind = FindingKind::kRankFailed;
  inc.first_rank = 0;
  inc.first_node = "node0";
  // Rank 0 reports a lost peer; rank 3 died earlier, saying nothing the rules know.
  inc.lines = {{0, "node0", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
                            "Connection closed by peer [10.0.0.2]:45678"},
               {3, "node1", "epoch 3 batch 17"}};
  inc.exit_times[0] = 20 * kSecond;
  inc.exit_times[3] = 10 * kSecond;
  Blame b = AssignBlame(&*rules, inc, NodeOf);
  EXPECT_EQ(b.culprit_rank, 3) << b.attribution.category << " " << b.first_in_time;
  EXPECT_NE(b.first_in_time.find("rank 3 failed first"), std::string::npos);
}

Blame Attributed(const std::string& category, const std::string& rule, const std::string& action,
                 int rank, std::int64_t step) {
  Blame b;
  b.attribution.category = category;
  b.attribution.rule_id = rule;
  b.attribution.action = action;
  b.attribution.answered_by = "rules";
  b.attribution.confidence = 0.9;
  b.culprit_ranks = {rank};
  b.culprit_rank = rank;
  b.culprit_node = NodeOf(rank);
  b.culprit_nodes = {NodeOf(rank)};
  b.step = step;
  return b;
}

Incident FailedAt(std::int64_t step) {
  Incident inc;
  inc.kind = FindingKind::kRankFailed;
  inc.failure_step = step;
  return inc;
}

TEST(BlameTest, ADetectorsVerdictRestsOnItsOwnMeasurementNotOnTheRanksOutput) {
  Incident inc;
  inc.number = 1;
  inc.kind = FindingKind::kStraggler;
  inc.first_rank = 3;
  inc.first_node = "node1";
  inc.AddLine({3, "node1", "trainguard: node node1 is a communication straggler"});
  inc.verdict_lines = inc.lines;
  for (int step = 40; step < 60; ++step) inc.AddLine({0, "node0", "step " + std::to_string(step) + " loss 0.012"});
  DetectorVerdict v;
  v.rule_id = "straggler-communication";
  v.category = "network";
  v.evict_nodes = {"node1"};
  inc.verdict = v;
  Blame b = AssignBlame(nullptr, inc, NodeOf);
  ASSERT_EQ(b.attribution.evidence.size(), 1u);
  EXPECT_EQ(b.attribution.evidence[0].line, "trainguard: node node1 is a communication straggler");
  EXPECT_EQ(b.attribution.evidence[0].category, "network");
  EXPECT_EQ(b.culprit_nodes, std::set<std::string>{"node1"});
}

TEST(RecoveryPolicyTest, ADeterministicFailureIsRestartedOnceThenStopped) {
  RecoveryPolicy policy(3);
  Blame b = Attributed("user_code", "python_exception", "stop", 1, 12);
  Verdict first = policy.Decide(b, FailedAt(12), {});
  EXPECT_EQ(first.decision, Decision::kRestart);
  EXPECT_NE(first.why.find("once to rule out a transient cause"), std::string::npos);
  Verdict second = policy.Decide(b, FailedAt(12), {});
  EXPECT_EQ(second.decision, Decision::kStop);
  EXPECT_NE(second.why.find("deterministic"), std::string::npos);
}

TEST(RecoveryPolicyTest, TheSameFailureAtAnotherStepIsNotARepeat) {
  RecoveryPolicy policy(3);
  EXPECT_EQ(policy.Decide(Attributed("user_code", "x", "stop", 1, 12), FailedAt(12), {}).decision,
            Decision::kRestart);
  EXPECT_EQ(policy.Decide(Attributed("user_code", "x", "stop", 1, 30), FailedAt(30), {}).decision,
            Decision::kRestart);
}

TEST(RecoveryPolicyTest, FailuresThatNeverGetFurtherStopTheRestartLoop) {
  RecoveryPolicy policy(2);
  EXPECT_EQ(policy.Decide(Attributed("other", "", "restart", 0, 50), FailedAt(50), {}).decision,
            Decision::kRestart);
  EXPECT_EQ(policy.Decide(Attributed("other", "", "restart", 1, 40), FailedAt(40), {}).decision,
            Decision::kRestart);
  Verdict v = policy.Decide(Attributed("other", "", "restart", 2, 45), FailedAt(45), {});
  EXPECT_EQ(v.decision, Decision::kStop);
  EXPECT_NE(v.why.find("2 failures in a row without getting past step 50"), std::string::npos);
}

TEST(RecoveryPolicyTest, UnrelatedFailuresOfOtherNodesAreNotARestartLoop) {
  // A large job: faults of other nodes, other causes, before it gets back
  // past its last failure. Not a loop; a related one after them is counted.
  RecoveryPolicy policy(2);
  EXPECT_EQ(policy.Decide(Attributed("gpu_hardware", "gpu-off-bus", "evict_node", 3, 50), FailedAt(50), {}).decision,
            Decision::kEvict);
  EXPECT_EQ(policy.Decide(Attributed("network", "net-completion-error", "restart", 17, 40), FailedAt(40), {}).decision,
            Decision::kRestart);
  EXPECT_EQ(policy.Decide(Attributed("user_code", "user-shape", "stop", 40, 45), FailedAt(45), {}).decision,
            Decision::kRestart);
  EXPECT_EQ(policy.Decide(Attributed("other", "", "restart", 9, 41), FailedAt(41), {}).decision,
            Decision::kRestart);
  Verdict v = policy.Decide(Attributed("other", "", "restart", 12, 42), FailedAt(42), {});
  EXPECT_EQ(v.decision, Decision::kStop);
  EXPECT_NE(v.why.find("2 failures in a row without getting past step 50"), std::string::npos);
}

TEST(RecoveryPolicyTest, ANewCheckpointIsProgress) {
  // Failures faster than checkpoints: the job never gets back past its best
  // failure step, but each time it has a newer checkpoint: it moves.
  RecoveryPolicy policy(2);
  for (std::int64_t ckpt : {100, 200, 300, 400}) {
    Incident inc = FailedAt(ckpt + 50);
    inc.failure_step = 450 - ckpt / 10;  // below the first failure's
    inc.checkpoint_step = ckpt;
    EXPECT_EQ(policy.Decide(Attributed("other", "", "restart", 0, inc.failure_step), inc, {}).decision,
              Decision::kRestart);
  }
}

TEST(RecoveryPolicyTest, TheSameCrashAtStepsFarApartIsNotALoop) {
  // Three crashes of one kind on other ranks, hundreds of steps apart, none
  // past the best: independent (a job of 100,000 GPUs sees several a day).
  RecoveryPolicy policy(2);
  EXPECT_EQ(policy.Decide(Attributed("user_code", "x", "restart", 1, 900), FailedAt(900), {}).decision,
            Decision::kRestart);
  for (std::int64_t step : {500, 700, 600}) {
    EXPECT_EQ(policy.Decide(Attributed("user_code", "x", "restart", static_cast<int>(step), step), FailedAt(step), {})
                  .decision,
              Decision::kRestart)
        << step;
  }
}

TEST(RecoveryPolicyTest, ProgressResetsTheStormGuard) {
  RecoveryPolicy policy(2);
  for (std::int64_t step : {50, 40, 60, 55}) {
    EXPECT_EQ(policy.Decide(Attributed("other", "", "restart", 0, step), FailedAt(step), {}).decision,
              Decision::kRestart)
        << step;
  }
}

TEST(RecoveryPolicyTest, HardwareRulesEvictTheCulpritNodes) {
  RecoveryPolicy policy(3);
  Verdict v = policy.Decide(Attributed("gpu_hardware", "xid_79", "evict_node", 3, 5), FailedAt(5), {});
  EXPECT_EQ(v.decision, Decision::kEvict);
  EXPECT_EQ(v.evict_nodes, std::vector<std::string>{"node1"});
}

TEST(RecoveryPolicyTest, ANodeWithHardwareHistoryIsEvictedOnAnUnexplainedFailure) {
  RecoveryPolicy policy(3);
  Blame b = Attributed("other", "", "restart", 3, 5);
  EXPECT_EQ(policy.Decide(b, FailedAt(5), HardwareHistory({{"node1", 0}})).decision, Decision::kRestart);
  RecoveryPolicy fresh(3);
  Verdict v = fresh.Decide(b, FailedAt(5), HardwareHistory({{"node1", 2}}));
  EXPECT_EQ(v.decision, Decision::kEvict);
  EXPECT_NE(v.history.find("node node1 had 2 hardware incident(s)"), std::string::npos);
  // A user-code failure is not the node's fault, whatever its history.
  RecoveryPolicy user(3);
  EXPECT_EQ(user.Decide(Attributed("user_code", "x", "stop", 3, 5), FailedAt(5), HardwareHistory({{"node1", 2}})).decision,
            Decision::kRestart);
}

TEST(RecoveryPolicyTest, ANodeWatchedForNewGpuErrorsIsEvictedWhenAHangIsItsRank) {
  Incident inc = Hang({0, 1, 2, 3}, 3);
  inc.hang_evidence = "rank 3 is outside any communication (phase 'forward') while 3 rank(s) wait in one";
  Blame b = AssignBlame(nullptr, inc, NodeOf);
  ASSERT_EQ(b.culprit_nodes, (std::set<std::string>{"node1"}));
  FleetFinding fleet;
  fleet.watched_nodes["node1"] = "GPU errors: GPU 3 uncorrected ECC errors 0 -> 2";
  RecoveryPolicy policy(3);
  Verdict v = policy.Decide(b, inc, fleet);
  EXPECT_EQ(v.decision, Decision::kEvict) << v.why;
  EXPECT_EQ(v.evict_nodes, std::vector<std::string>{"node1"});
  EXPECT_NE(v.why.find("node node1 is watched: GPU errors: GPU 3 uncorrected ECC"), std::string::npos) << v.why;
  // Unwatched, the same hang restarts.
  RecoveryPolicy fresh(3);
  EXPECT_EQ(fresh.Decide(b, inc, FleetFinding{}).decision, Decision::kRestart);
}

// What the learned model answered (no rule explained the log): a hardware
// category, its recommendation never more than a restart.
Blame ByModel(const std::string& category, int rank, std::int64_t step) {
  Blame b = Attributed(category, kModelRuleId, "restart", rank, step);
  b.attribution.answered_by = "model";
  b.attribution.hardware = IsHardwareCategory(category);
  b.attribution.confidence = 0.93;
  return b;
}

TEST(RecoveryPolicyTest, AHardwareReadingOfTheModelAloneRestartsAndNeverEvicts) {
  RecoveryPolicy policy(3);
  Verdict v = policy.Decide(ByModel("gpu_hardware", 3, 5), FailedAt(5), {});
  EXPECT_EQ(v.decision, Decision::kRestart) << v.why;
  EXPECT_TRUE(v.evict_nodes.empty());
}

TEST(RecoveryPolicyTest, AModelReadingOnANodeWithRuleBackedHardwareHistoryEvictsIt) {
  RecoveryPolicy policy(3);
  Verdict v = policy.Decide(ByModel("gpu_hardware", 3, 5), FailedAt(5), HardwareHistory({{"node1", 1}}));
  EXPECT_EQ(v.decision, Decision::kEvict) << v.why;
  EXPECT_EQ(v.evict_nodes, std::vector<std::string>{"node1"});
}

TEST(RecoveryPolicyTest, ARecommendationBelowTheMinimumConfidenceRestartsAndSaysWhy) {
  RecoveryPolicy policy(3, /*min_confidence=*/0.8);
  Blame unsure = Attributed("gpu_hardware", "gpu-ecc", "evict_node", 3, 5);
  unsure.attribution.confidence = 0.6;
  Verdict v = policy.Decide(unsure, FailedAt(5), {});
  EXPECT_EQ(v.decision, Decision::kRestart);
  EXPECT_NE(v.why.find("evict_node, needs confidence 0.80; this one has 0.60"), std::string::npos) << v.why;
  Blame sure = Attributed("gpu_hardware", "gpu-ecc", "evict_node", 3, 6);
  sure.attribution.confidence = 0.85;
  EXPECT_EQ(policy.Decide(sure, FailedAt(6), {}).decision, Decision::kEvict);
  // A deterministic stop is held to it too: an unsure repeat restarts.
  RecoveryPolicy stops(3, 0.8);
  Blame bug = Attributed("user_code", "python-exception", "stop", 1, 12);
  bug.attribution.confidence = 0.5;
  stops.Decide(bug, FailedAt(12), {});
  EXPECT_EQ(stops.Decide(bug, FailedAt(12), {}).decision, Decision::kRestart);
  // The node's history is not held to it: it rests on other incidents.
  Blame vague = Attributed("other", "", "restart", 3, 7);
  vague.attribution.confidence = 0.2;
  EXPECT_EQ(policy.Decide(vague, FailedAt(7), HardwareHistory({{"node1", 2}})).decision, Decision::kEvict);
}

TEST(PolicyMemoryTest, SignaturesRoundTripAsObjectsAndTheOldTextFormIsStillRead) {
  RecoveryPolicy policy(3);
  policy.Decide(Attributed("user_code", "a|rule|with|bars", "stop", 1, 12), FailedAt(12), {});
  const std::string text = policy.memory().ToJson();
  EXPECT_NE(text.find("\"rule\":\"a|rule|with|bars\""), std::string::npos) << text;
  auto back = PolicyMemory::FromJson(text);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->signatures.size(), 1u);
  EXPECT_EQ(back->signatures[0], (IncidentSignature{"user_code", "a|rule|with|bars", 1, 12}));
  // A controller that restarts on a job an older one recorded: the repeat is still a repeat.
  auto old = PolicyMemory::FromJson(R"({"signatures": ["user_code|a|rule|with|bars|1|12"], "best_failure_step": 12,
                                        "best_checkpoint_step": -1, "no_progress_incidents": 0})");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->signatures, back->signatures);
  RecoveryPolicy resumed(3);
  resumed.Restore(*old);
  EXPECT_EQ(resumed.Decide(Attributed("user_code", "a|rule|with|bars", "stop", 1, 12), FailedAt(12), {}).decision,
            Decision::kStop);
  for (const char* bad : {R"({"signatures": ["no bars"]})", R"({"signatures": ["c|r|x|12"]})",
                          R"({"signatures": [{"category": "c", "rule": "r", "rank": "1", "step": 2}]})"}) {
    auto m = PolicyMemory::FromJson(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.status().message().find("signature"), std::string::npos) << m.status().message();
  }
}

}  // namespace
}  // namespace trainguard
