// DiagnosisCoordinator on its own: a node registry, answers fed by hand, the
// actions it returns checked in their order.
#include "controller/diagnosis_coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "diag/suite.h"

namespace trainguard {
namespace {

class DiagnosisCoordinatorTest : public testing::Test {
 protected:
  DiagnosisCoordinatorTest() {
    config_.job_id = "job";
    config_.nproc_per_node = 1;
    config_.diagnose = DiagnoseMode::kQuick;
    config_.diag_timeout = 60 * kSecond;
    config_.argv = {"/usr/bin/python3", "train.py"};
  }

  JobNode& Node(const std::string& id, int group_rank, const std::string& rack = "") {
    JobNode n;
    n.node_id = id;
    n.group_rank = group_rank;
    n.conn = nodes_.size() + 1;
    n.runs_diagnostics = true;
    n.address = "10.0.0." + std::to_string(nodes_.size());
    n.diag_port = 7000;
    n.free_port = 9000;
    n.rack = rack;
    return nodes_.Add(n);
  }

  template <typename A>
  static std::vector<A> Of(const DiagActions& actions) {
    std::vector<A> out;
    for (const auto& a : actions) {
      if (const A* x = std::get_if<A>(&a)) out.push_back(*x);
    }
    return out;
  }

  // `node` answers the round's order with compute `gflops` (an error when < 0).
  DiagActions Answer(DiagnosisCoordinator& c, const std::string& node, std::int64_t round, double gflops) {
    v1::DiagnosticsResult r;
    r.set_round(round);
    r.set_wall_ms(5);
    r.set_figures_json(FiguresToJson({{"compute_gflops", gflops < 0 ? 0 : gflops, gflops < 0 ? "probe failed" : ""}}));
    return c.Answer(*nodes_.ById(node), r);
  }

  JobConfig config_;
  NodeRegistry nodes_;
};

TEST_F(DiagnosisCoordinatorTest, AsksTheJobsNodesInGroupRankOrderThenTheSparesEachWithItsRingPeers) {
  Node("spare", -1);
  Node("b", 1);
  Node("a", 0);
  JobNode& away = Node("away", 2);
  away.conn = 0;  // not connected: not asked
  Node("mute", 3).runs_diagnostics = false;
  DiagnosisCoordinator c(config_);
  DiagActions started = c.Start(DiagnosisPurpose::kIncident, "incident 4", nodes_);
  ASSERT_EQ(started.size(), 1u);
  const auto event = std::get<DiagEvent>(started[0]);
  EXPECT_EQ(event.kind, EventKind::kDiagnosisStarted);
  EXPECT_NE(event.detail_json.find(R"("nodes":["a","b","spare"])"), std::string::npos) << event.detail_json;
  EXPECT_NE(event.message.find("incident 4"), std::string::npos);
  EXPECT_EQ(c.round_size(), 3u);
  const auto orders = Of<DiagOrder>(c.SendOrders(nodes_, 0));
  ASSERT_EQ(orders.size(), 3u);
  EXPECT_EQ(orders[0].node, "a");
  EXPECT_EQ(orders[2].node, "spare");
  const v1::RunDiagnostics& a = orders[0].msg.run_diagnostics();
  EXPECT_EQ(a.round(), 1);
  EXPECT_EQ(a.mode(), "quick");
  EXPECT_FALSE(a.collective());
  // A ring of three: a's neighbours are the other two (b, spare), each once.
  std::vector<std::string> peers(a.peers().begin(), a.peers().end());
  std::sort(peers.begin(), peers.end());
  EXPECT_EQ(peers, (std::vector<std::string>{"10.0.0.0:7000", "10.0.0.1:7000"}));
}

TEST_F(DiagnosisCoordinatorTest, AFailingNodeIsEvictedBeforeTheVerdictAndTheRoundEndsWithWhatFollows) {
  Node("a", 0);
  Node("b", 1);
  Node("c", 2);
  DiagnosisCoordinator c(config_);
  c.Start(DiagnosisPurpose::kPreflight, "preflight", nodes_);
  c.SendOrders(nodes_, 0);
  DiagActions answered = Answer(c, "a", 1, 100);
  ASSERT_EQ(answered.size(), 2u);
  EXPECT_EQ(std::get<DiagRecord>(answered[0]).node, "a");
  EXPECT_EQ(std::get<DiagEvent>(answered[1]).kind, EventKind::kDiagnostics);
  EXPECT_TRUE(Answer(c, "b", 7, 100).empty());  // another round's answer: not taken
  EXPECT_TRUE(c.Finish(nodes_, 1).empty());     // b and c still run
  Answer(c, "b", 1, -1);                        // its probe failed
  Answer(c, "c", 1, 101);
  DiagActions verdict = c.Finish(nodes_, 2);
  ASSERT_EQ(verdict.size(), 3u);
  const auto evicted = std::get<DiagEviction>(verdict[0]);
  EXPECT_EQ(evicted.node, "b");
  EXPECT_NE(evicted.why.find("diagnostics (preflight)"), std::string::npos) << evicted.why;
  const auto event = std::get<DiagEvent>(verdict[1]);
  EXPECT_EQ(event.kind, EventKind::kDiagnosis);
  EXPECT_NE(event.message.find("failing: b"), std::string::npos) << event.message;
  EXPECT_EQ(std::get<DiagDone>(verdict[2]).purpose, DiagnosisPurpose::kPreflight);
  EXPECT_FALSE(c.active());
  EXPECT_TRUE(c.Finish(nodes_, 3).empty());  // over: nothing more
}

TEST_F(DiagnosisCoordinatorTest, ANodeGoneDuringTheRoundFailsWithoutAnEviction) {
  Node("a", 0);
  Node("b", 1);
  DiagnosisCoordinator c(config_);
  c.Start(DiagnosisPurpose::kIncident, "incident 1", nodes_);
  nodes_.ById("b")->conn = 0;  // its agent went away before its order
  const auto orders = Of<DiagOrder>(c.SendOrders(nodes_, 0));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].node, "a");
  Answer(c, "a", 1, 100);
  DiagActions verdict = c.Finish(nodes_, 1);
  EXPECT_TRUE(Of<DiagEviction>(verdict).empty());  // the loss said so already
  ASSERT_FALSE(verdict.empty());
  EXPECT_EQ(std::get<DiagDone>(verdict.back()).purpose, DiagnosisPurpose::kIncident);
}

TEST_F(DiagnosisCoordinatorTest, NodesOfARackAllReduceTogetherAfterTheirOwnProbes) {
  Node("a", 0, "r1");
  Node("b", 1, "r1");
  Node("c", 2, "r2");  // alone in its rack: no rack stage for it
  DiagnosisCoordinator c(config_);
  c.Start(DiagnosisPurpose::kIncident, "incident 1", nodes_);
  c.SendOrders(nodes_, 0);
  for (const char* n : {"a", "b", "c"}) Answer(c, n, 1, 100);
  const auto orders = Of<DiagOrder>(c.Finish(nodes_, 1));
  ASSERT_EQ(orders.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const v1::RunDiagnostics& o = orders[i].msg.run_diagnostics();
    EXPECT_TRUE(o.collective());
    EXPECT_EQ(o.rack_rank(), i);
    EXPECT_EQ(o.rack_size(), 2);
    EXPECT_EQ(o.rack_master(), "10.0.0.0:9000");  // the rack's first node, on its free port
    EXPECT_FALSE(o.nccl());                       // no GPUs listed
    EXPECT_EQ(o.python(), "/usr/bin/python3");    // the job's interpreter
  }
  EXPECT_EQ(orders[0].node, "a");
  EXPECT_EQ(orders[1].node, "b");
  Answer(c, "a", 1, 100);
  Answer(c, "b", 1, 100);
  DiagActions verdict = c.Finish(nodes_, 2);
  ASSERT_FALSE(verdict.empty());
  EXPECT_TRUE(std::holds_alternative<DiagDone>(verdict.back()));
  EXPECT_TRUE(Of<DiagEviction>(verdict).empty());
}

}  // namespace
}  // namespace trainguard
