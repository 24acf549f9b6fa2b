// What other jobs' incidents say of this one, and what the policy makes of it.
#include "controller/fleet_history.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

constexpr Nanos kNow = 1000 * kSecond;

// rank 3 on node1 failed with `rule` at `step`.
Blame Failed(const std::string& category, const std::string& rule, const std::string& action,
             std::int64_t step) {
  Blame b;
  b.attribution.category = category;
  b.attribution.rule_id = rule;
  b.attribution.action = action;
  b.attribution.description = "described";
  b.attribution.answered_by = "rules";
  b.attribution.confidence = 0.9;
  b.culprit_ranks = {3};
  b.culprit_rank = 3;
  b.culprit_node = "node1";
  b.culprit_nodes = {"node1"};
  b.step = step;
  return b;
}

IncidentRecord Past(const std::string& job, const std::string& node, int rank, const std::string& category,
                    const std::string& rule, std::int64_t step, Nanos wall = kNow - kSecond) {
  return {job, 1, wall, node, rank, category, rule, "restart", step, "{}"};
}

FleetQuery Query() {
  FleetQuery q;
  q.job_id = "now";
  q.program = "train.py";
  q.program_of_job = {{"now", "train.py"}, {"a", "train.py"}, {"b", "train.py"}, {"other", "eval.py"}};
  q.since = kNow - 100 * kSecond;
  return q;
}

TEST(ProgramOfTest, NamesTheScriptOrModuleAPythonRuns) {
  EXPECT_EQ(ProgramOf({"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"}), "train.py");
  EXPECT_EQ(ProgramOf({"python3.11", "-X", "dev", "-m", "torchtitan.train", "--job.config_file", "x"}),
            "-m torchtitan.train");
  EXPECT_EQ(ProgramOf({"python", "-c", "import x"}), "");
  EXPECT_EQ(ProgramOf({"/opt/bin/train", "--steps", "5"}), "/opt/bin/train");
  EXPECT_EQ(ProgramOf({}), "");
}

TEST(FleetHistoryTest, TheSameErrorOnTheSameNodeInAnotherJobPointsToTheNode) {
  std::vector<IncidentRecord> past = {
      Past("a", "node1", 0, "network", "nccl-timeout", 40),       // another job, another rank and step
      Past("now", "node1", 3, "network", "nccl-timeout", 7),      // this job's own: does not count
      Past("b", "node2", 0, "network", "nccl-timeout", 40),       // another node
      Past("a", "node1", 0, "network", "ib-link-down", 9),        // another error
      Past("old", "node1", 0, "network", "nccl-timeout", 1, kNow - 500 * kSecond)};  // too old
  FleetFinding f = ReadFleetHistory(Failed("network", "nccl-timeout", "restart", 12), past, Query());
  ASSERT_TRUE(f.PointsAtNode());
  EXPECT_FALSE(f.PointsAtApplication());
  ASSERT_EQ(f.same_error_on_node.size(), 1u);
  EXPECT_EQ(f.same_error_on_node[0].job_id, "a");
  EXPECT_EQ(f.Summary(), "the same nccl-timeout failure happened on node node1 in job a (node1)");
  EXPECT_EQ(f.hardware_on_node.at("node1"), 2);  // both of job a's (network is hardware)
  EXPECT_NE(f.EvidenceJson().find("\"job_id\":\"a\""), std::string::npos);

  // An operator who cleared the node since then clears its history.
  FleetQuery cleared = Query();
  cleared.node_since["node1"] = kNow - 1;
  EXPECT_FALSE(ReadFleetHistory(Failed("network", "nccl-timeout", "restart", 12), past, cleared).PointsAtNode());
}

TEST(FleetHistoryTest, TheSameProgramFailingAtTheSameRankAndStepElsewherePointsToTheApplication) {
  std::vector<IncidentRecord> past = {Past("a", "node4", 3, "other", "segfault", 12),
                                      Past("b", "node7", 3, "other", "segfault", 12)};
  FleetFinding f = ReadFleetHistory(Failed("other", "segfault", "restart", 12), past, Query());
  ASSERT_TRUE(f.PointsAtApplication());
  EXPECT_FALSE(f.PointsAtNode());
  EXPECT_EQ(f.Summary(),
            "the same segfault failure of rank 3 at step 12 happened in job a (node4), job b (node7) of the "
            "same program on other nodes: it follows the program, not the node");
}

TEST(FleetHistoryTest, ACoincidenceIsNotAPattern) {
  FleetFinding f;
  // Another program, same rule, rank and step.
  f = ReadFleetHistory(Failed("other", "segfault", "restart", 12), {Past("other", "node4", 3, "other", "segfault", 12)},
                       Query());
  EXPECT_FALSE(f.PointsAtApplication());
  // The same program at another step.
  f = ReadFleetHistory(Failed("other", "segfault", "restart", 12), {Past("a", "node4", 3, "other", "segfault", 30)},
                       Query());
  EXPECT_FALSE(f.PointsAtApplication());
  EXPECT_FALSE(f.PointsAtNode());
  // The same program at the same place on the same node: the program's pattern, not the node's.
  f = ReadFleetHistory(Failed("other", "segfault", "restart", 12), {Past("a", "node1", 3, "other", "segfault", 12)},
                       Query());
  EXPECT_FALSE(f.PointsAtNode());
  // A user-code rule on the same node in another job says nothing of the node.
  f = ReadFleetHistory(Failed("user_code", "python-exception", "stop", 12),
                       {Past("other", "node1", 0, "user_code", "python-exception", 5)}, Query());
  EXPECT_FALSE(f.PointsAtNode());
  // No rule: nothing to compare.
  f = ReadFleetHistory(Failed("other", "", "restart", 12), {Past("a", "node4", 3, "other", "", 12)}, Query());
  EXPECT_FALSE(f.PointsAtApplication());
}

TEST(FleetPolicyTest, TheApplicationsPatternStopsAtTheFirstIncident) {
  RecoveryPolicy policy(3);
  FleetFinding f = ReadFleetHistory(Failed("other", "segfault", "restart", 12),
                                    {Past("a", "node4", 3, "other", "segfault", 12)}, Query());
  Incident inc;
  inc.failure_step = 12;
  Verdict v = policy.Decide(Failed("other", "segfault", "restart", 12), inc, f);
  EXPECT_EQ(v.decision, Decision::kStop);
  EXPECT_NE(v.why.find("in job a (node4)"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("cannot help"), std::string::npos) << v.why;
}

TEST(FleetPolicyTest, TheNodesPatternEvictsEvenWhereTheRuleWouldRestart) {
  RecoveryPolicy policy(3);
  FleetFinding f = ReadFleetHistory(Failed("software", "cuda-launch-failure", "restart", 12),
                                    {Past("a", "node1", 0, "software", "cuda-launch-failure", 80)}, Query());
  Incident inc;
  inc.failure_step = 12;
  Verdict v = policy.Decide(Failed("software", "cuda-launch-failure", "restart", 12), inc, f);
  EXPECT_EQ(v.decision, Decision::kEvict);
  EXPECT_EQ(v.evict_nodes, std::vector<std::string>{"node1"});
  EXPECT_NE(v.why.find("in job a (node1)"), std::string::npos) << v.why;
  // Without the other job, the same failure restarts.
  RecoveryPolicy fresh(3);
  EXPECT_EQ(fresh.Decide(Failed("software", "cuda-launch-failure", "restart", 12), inc, {}).decision,
            Decision::kRestart);
}

TEST(FleetHistoryTest, TheModelsOwnPastReadingsAreNoHistoryForItsNextOne) {
  Blame b = Failed("gpu_hardware", kModelRuleId, "restart", 12);
  b.attribution.answered_by = "model";
  std::vector<IncidentRecord> past = {Past("a", "node1", 3, "gpu_hardware", kModelRuleId, 40),
                                      Past("b", "node1", 0, "gpu_hardware", kModelRuleId, 7)};
  FleetFinding f = ReadFleetHistory(b, past, Query());
  EXPECT_TRUE(f.hardware_on_node.empty());
  EXPECT_FALSE(f.PointsAtNode());
  // A rule's hardware incident on the node is history, for the model's reading too.
  past.push_back(Past("c", "node1", 2, "gpu_hardware", "gpu-ecc", 9));
  EXPECT_EQ(ReadFleetHistory(b, past, Query()).hardware_on_node.at("node1"), 1);
  // And the model's past reading is history for a rule's vague answer: it raised suspicion.
  Blame vague = Failed("other", "", "restart", 12);
  EXPECT_EQ(ReadFleetHistory(vague, {past[0]}, Query()).hardware_on_node.at("node1"), 1);
}

}  // namespace
}  // namespace trainguard
