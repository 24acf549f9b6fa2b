// Corroboration of hardware verdicts read from log lines, and what the
// recovery policy does with it: suspects are diagnosed, never evicted
// blind; the same GPU failing again at another step is evicted.
#include "controller/corroboration.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace trainguard {
namespace {

// A bare CUDA launch failure printed by rank 3 (node1), as the rules read it.
Blame LaunchFailure(int rank, std::int64_t step) {
  Blame b;
  Attribution& a = b.attribution;
  a.category = "gpu_hardware";
  a.rule_id = "gpu-launch-failure";
  a.action = "evict_node";
  a.answered_by = "rules";
  a.hardware = true;
  a.confidence = 0.86;
  a.evidence.push_back({rank, "node" + std::to_string(rank / 2), "gpu-launch-failure", "gpu_hardware", "cause",
                        "RuntimeError: CUDA error: unspecified launch failure"});
  b.culprit_ranks = {rank};
  b.culprit_rank = rank;
  b.culprit_node = "node" + std::to_string(rank / 2);
  b.culprit_nodes = {b.culprit_node};
  b.step = step;
  return b;
}

Incident At(std::int64_t step) {
  Incident inc;
  inc.failure_step = step;
  return inc;
}

TEST(CorroborationTest, ARanksLineAloneIsUnsupportedTheNodesOwnSignalsSupportIt) {
  Blame b = LaunchFailure(3, 40);
  Corroboration alone = Corroborate(b, At(40), {}, {});
  EXPECT_TRUE(alone.log_only);
  EXPECT_EQ(alone.unsupported, std::vector<std::string>{"node1"});
  EXPECT_TRUE(alone.support.empty());

  // An Xid in node1's heartbeats.
  Corroboration beat = Corroborate(b, At(40), {}, {{"node1", {{"GPU 1: Xid 79 (1 new)"}}}});
  EXPECT_TRUE(beat.unsupported.empty());
  EXPECT_EQ(beat.support["node1"], std::vector<std::string>{"heartbeat: GPU 1: Xid 79 (1 new)"});
  // Another node's GPU errors say nothing of node1.
  EXPECT_EQ(Corroborate(b, At(40), {}, {{"node0", {{"GPU 0: Xid 79 (1 new)"}}}}).unsupported,
            std::vector<std::string>{"node1"});

  // The node's kernel log (rank -1 lines) of a hardware kind.
  Blame kernel = b;
  kernel.attribution.evidence.push_back(
      {-1, "node1", "xid-79", "gpu_hardware", "cause", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."});
  EXPECT_EQ(Corroborate(kernel, At(40), {}, {}).support["node1"].front(),
            "kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");

  // Its history in other jobs, or a watch on it.
  FleetFinding fleet;
  fleet.hardware_on_node["node1"] = 2;
  EXPECT_EQ(Corroborate(b, At(40), fleet, {}).support["node1"].front(), "history: 2 hardware incident(s) in other jobs");
  FleetFinding watched;
  watched.watched_nodes["node1"] = "GPU errors: GPU 1: uncorrected ECC errors 0 -> 1";
  EXPECT_EQ(Corroborate(b, At(40), watched, {}).support["node1"].size(), 1u);

  // Only a rules' reading that would evict is log-only: not the model's,
  // not a detector's measurement, not a restart.
  Blame model = b;
  model.attribution.answered_by = "model";
  EXPECT_FALSE(Corroborate(model, At(40), {}, {}).log_only);
  Incident measured = At(40);
  measured.verdict = DetectorVerdict{};
  EXPECT_FALSE(Corroborate(b, measured, {}, {}).log_only);
  Blame restart = b;
  restart.attribution.action = "restart";
  EXPECT_FALSE(Corroborate(restart, At(40), {}, {}).log_only);
  // A GPU error says nothing of a network verdict.
  Blame net = b;
  net.attribution.category = "network";
  EXPECT_EQ(Corroborate(net, At(40), {}, {{"node1", {{"GPU 1: Xid 79 (1 new)"}}}}).unsupported,
            std::vector<std::string>{"node1"});
  auto j = nlohmann::json::parse(beat.ToJson());
  EXPECT_EQ(j["support"]["node1"][0], "heartbeat: GPU 1: Xid 79 (1 new)");
  EXPECT_TRUE(j["log_only"]);
}

TEST(CorroborationTest, AnUnsupportedVerdictDiagnosesTheNodeAndTheSameGpuFailingAgainLaterEvictsIt) {
  RecoveryPolicy policy(5);
  Blame first = LaunchFailure(3, 40);
  Corroboration c = Corroborate(first, At(40), {}, {});
  Verdict v = policy.Decide(first, At(40), {}, &c, /*culprit_gpu=*/1);
  EXPECT_EQ(v.decision, Decision::kRestart) << v.why;
  EXPECT_TRUE(v.evict_nodes.empty());
  EXPECT_EQ(v.diagnose_nodes, std::vector<std::string>{"node1"});
  EXPECT_NE(v.why.find("from its log alone"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("suspected, diagnosing it"), std::string::npos) << v.why;
  ASSERT_EQ(policy.memory().suspicions.size(), 1u);
  EXPECT_EQ(policy.memory().suspicions[0], (Suspicion{"node1", 1, "gpu-launch-failure", 40}));

  // Another GPU of the same node: a suspicion of its own, not a repeat.
  Verdict other = policy.Decide(first, At(45), {}, &c, /*culprit_gpu=*/0);
  EXPECT_EQ(other.decision, Decision::kRestart) << other.why;

  // The same GPU at the same step: it follows the program, not the GPU.
  Verdict same_place = policy.Decide(LaunchFailure(3, 42), At(42), {}, &c, 1);
  EXPECT_EQ(same_place.decision, Decision::kRestart) << same_place.why;
  EXPECT_NE(same_place.why.find("follows the program"), std::string::npos) << same_place.why;

  // The same GPU, later in the run: the GPU's.
  Blame again = LaunchFailure(3, 90);
  Verdict evict = policy.Decide(again, At(90), {}, &c, 1);
  EXPECT_EQ(evict.decision, Decision::kEvict) << evict.why;
  EXPECT_EQ(evict.evict_nodes, std::vector<std::string>{"node1"});
  EXPECT_NE(evict.why.find("failed so before at another step"), std::string::npos) << evict.why;

  // What a restarted controller reads back decides the same.
  auto restored = PolicyMemory::FromJson(policy.memory().ToJson());
  ASSERT_TRUE(restored.ok()) << restored.status().message();
  EXPECT_EQ(restored->suspicions, policy.memory().suspicions);
  RecoveryPolicy successor(5);
  successor.Restore(*restored);
  EXPECT_EQ(successor.Decide(LaunchFailure(3, 150), At(150), {}, &c, 1).decision, Decision::kEvict);
  EXPECT_FALSE(PolicyMemory::FromJson(R"({"suspicions": [{"node": "n", "gpu": "x", "rule": "r", "step": 1}]})").ok());
  EXPECT_FALSE(PolicyMemory::FromJson(R"({"suspicions": 3})").ok());
}

TEST(CorroborationTest, ASupportedVerdictEvictsAtOnceSayingWhatAgreed) {
  RecoveryPolicy policy(5);
  Blame b = LaunchFailure(3, 40);
  Corroboration c = Corroborate(b, At(40), {}, {{"node1", {{"GPU 1: Xid 79 (1 new)"}}}});
  Verdict v = policy.Decide(b, At(40), {}, &c, 1);
  EXPECT_EQ(v.decision, Decision::kEvict) << v.why;
  EXPECT_EQ(v.evict_nodes, std::vector<std::string>{"node1"});
  EXPECT_TRUE(v.diagnose_nodes.empty());
  EXPECT_NE(v.why.find("its own signals agree: node1: heartbeat: GPU 1: Xid 79"), std::string::npos) << v.why;
  // Of two culprit nodes, the one whose signals agree goes; the other is a suspect.
  Blame two = b;
  two.culprit_nodes = {"node0", "node1"};
  Corroboration half = Corroborate(two, At(40), {}, {{"node1", {{"GPU 1: Xid 79 (1 new)"}}}});
  RecoveryPolicy fresh(5);
  Verdict split = fresh.Decide(two, At(40), {}, &half, 1);
  EXPECT_EQ(split.decision, Decision::kEvict);
  EXPECT_EQ(split.evict_nodes, std::vector<std::string>{"node1"});
  EXPECT_EQ(split.diagnose_nodes, std::vector<std::string>{"node0"});
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

TEST(CorroborationTest, AnUndeterminedHardwareReadingRestartsAfterDiagnosingItsNodes) {
  RecoveryPolicy policy(5, /*min_confidence=*/0.5);
  Blame unsure = LaunchFailure(3, 40);
  unsure.attribution.confidence = 0.42;
  Verdict v = policy.Decide(unsure, At(40), {});
  EXPECT_EQ(v.decision, Decision::kRestart) << v.why;
  EXPECT_EQ(v.diagnose_nodes, std::vector<std::string>{"node1"});
  EXPECT_NE(v.why.find("undetermined with hardware plausible"), std::string::npos) << v.why;
  // Undetermined software: restarted, nobody diagnosed.
  Blame bug = unsure;
  bug.attribution.category = "user_code";
  RecoveryPolicy fresh(5, 0.5);
  EXPECT_TRUE(fresh.Decide(bug, At(40), {}).diagnose_nodes.empty());
}

}  // namespace
}  // namespace trainguard
