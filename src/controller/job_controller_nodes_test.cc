// JobController: which nodes hold the job — evictions and cordons, spares,
// diagnosis rounds, node history, elastic jobs.
#include "controller/corroboration.h"
#include "controller/job_controller_test_fixture.h"

namespace trainguard {
namespace {

// What the node's kernel log says when its GPU fails: what corroborates the
// rank's own CUDA error (corroboration.h).
const char* const kXid79 = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.";

TEST_F(JobControllerTest, AGpuFaultEvictsTheCulpritNodeAndCordonsIt) {
  Make(2, 2, 3, true);
  Register(0);
  FakeAgentLink* b = Register(1);
  Exit(1, 0, 3, 0, 9, 12, "RuntimeError: CUDA error: unspecified launch failure", 0, kXid79);
  Stopped(0, 0);
  Stopped(1, 0);
  auto a = Detail("attribution");
  EXPECT_EQ(a["category"], "gpu_hardware");
  EXPECT_EQ(a["culprit_ranks"], nlohmann::json::array({3}));
  EXPECT_EQ(a["culprit_nodes"], nlohmann::json::array({"node1"}));
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_TRUE(b->closed);
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node1"});
  EXPECT_EQ(Stored().GetNodeHealth("node1")->status, "cordoned");
  auto actions = Stored().NodeActions("node1").value();
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].action, "evict");
  EXPECT_EQ(actions[0].by, "controller of job job");
  EXPECT_EQ(nlohmann::json::parse(actions[0].evidence_json)["rule"], a["rule"]);
  EXPECT_EQ(Detail("node_evicted")["evidence"]["category"], "gpu_hardware");
  EXPECT_EQ(controller_->state(), JobState::kRestarting);  // waits for the replacement
  auto incidents = Stored().IncidentsOnNode("node1");
  ASSERT_EQ(incidents->size(), 1u);
  EXPECT_EQ((*incidents)[0].category, "gpu_hardware");
}

TEST_F(JobControllerTest, AnXidInOneNodesKernelLogNamesThatNodeNotTheFirstRankToFail) {
  Make(2, 2, 3, true);
  Register(0);
  Register(1);
  // Rank 0 on node0 fails first, only because its peer vanished...
  Exit(0, 0, 0, 1, 0, 12, "RuntimeError: [gloo] Connection closed by peer [10.0.0.1]:1234");
  // ...node1's kernel log, reported with its Stopped message, says why.
  Stopped(0, 0);
  v1::AgentMessage m;
  m.mutable_stopped()->set_generation(0);
  m.mutable_stopped()->add_kernel_lines("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
  controller_->OnMessage(2, m);
  auto a = Detail("attribution");
  EXPECT_EQ(a["category"], "gpu_hardware");
  EXPECT_EQ(a["culprit_nodes"], nlohmann::json::array({"node1"}));
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node1"});
}

TEST_F(JobControllerTest, TheRankThatDiedFirstOutweighsPeersThatLostTheirConnection) {
  Make(1, 2, 3, true);
  Register(0);
  Nanos t = clock_.WallNanos();
  // Rank 0's report arrives first, but rank 1 died 5 ms earlier, saying
  // nothing a rule knows; rank 0 only lost its connection to it.
  Exit(0, 0, 0, 1, 0, 24, "RuntimeError: [gloo] Read error: Connection reset by peer", t + 5 * kMillisecond);
  Exit(0, 0, 1, 1, 0, 24, "rank 1: something went wrong in my loop", t);
  Stopped(0, 0);
  auto a = Detail("attribution");
  EXPECT_EQ(a["category"], "other");
  EXPECT_EQ(a["culprit_ranks"], nlohmann::json::array({1}));
  EXPECT_NE(a["first_in_time"].get<std::string>().find("rank 1 failed first"), std::string::npos);
}

TEST_F(JobControllerTest, RanksThatDiedTogetherAreOrderedByTheirLastWordsNotTheirExits) {
  Make(1, 2, 3, true);
  Register(0);
  Nanos t = clock_.WallNanos();
  // Rank 1 said its last words at t and tore down for 300 ms; rank 0 lost
  // its connection during that teardown (at t + 100 ms), said so, and
  // exited first.
  Exit(0, 0, 0, 1, 0, 24, "RuntimeError: [gloo] Read error: Connection reset by peer", t + 150 * kMillisecond,
       "", t + 100 * kMillisecond);
  Exit(0, 0, 1, 1, 0, 24, "rank 1: something went wrong in my loop", t + 300 * kMillisecond, "", t);
  Stopped(0, 0);
  auto a = Detail("attribution");
  EXPECT_EQ(a["culprit_ranks"], nlohmann::json::array({1}));
  EXPECT_NE(a["first_in_time"].get<std::string>().find("rank 1 failed first"), std::string::npos);
  auto exits = EventsOf("rank_exited");
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(exits[1].detail_json)["last_words_unix_ms"], t / kMillisecond);
}

TEST_F(JobControllerTest, ACordonedNodeIsRefusedAndSaysHowToReturnIt) {
  ASSERT_TRUE(store_.SetNodeHealth({"node1", "cordoned", "bad fan", "", 1}).ok());
  Make(2, 1);
  Register(0);
  FakeAgentLink* b = Register(1);
  EXPECT_TRUE(b->closed);
  ASSERT_NE(b->Last(Kind::kWelcome), nullptr);
  const std::string error = b->Last(Kind::kWelcome)->welcome().error();
  EXPECT_NE(error.find("node node1 is cordoned (bad fan)"), std::string::npos) << error;
  EXPECT_NE(error.find("trainguard uncordon node1"), std::string::npos) << error;
  EXPECT_EQ(controller_->state(), JobState::kStarting);
}

TEST_F(JobControllerTest, ASpareWaitsIdleThenTakesTheEvictedNodesGroupRank) {
  config_.spares = 1;
  Make(2, 2, 3, true);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  FakeAgentLink* spare = Register(2);
  EXPECT_FALSE(spare->closed);
  EXPECT_EQ(spare->Count(Kind::kStart), 0);  // idle
  EXPECT_EQ(Detail("node_registered", 2)["spare"], true);
  FakeAgentLink* extra = Register(3);  // beyond nnodes + spares
  EXPECT_TRUE(extra->closed);
  Exit(1, 0, 3, 0, 9, 12, "RuntimeError: CUDA error: unspecified launch failure", 0, kXid79);
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_TRUE(b->closed);
  // The restart does not wait for a replacement: the spare starts as group rank 1 at once.
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  ASSERT_NE(spare->Last(Kind::kStart), nullptr);
  EXPECT_EQ(spare->Last(Kind::kStart)->start().group_rank(), 1);
  EXPECT_EQ(spare->Last(Kind::kStart)->start().generation(), 1);
  EXPECT_EQ(a->Last(Kind::kStart)->start().generation(), 1);
  auto promoted = EventsOf("spare_promoted");
  ASSERT_EQ(promoted.size(), 1u);
  EXPECT_EQ(promoted[0].node, "node2");
}

TEST_F(JobControllerTest, AnIdleSpareThatGoesAwayIsNoFailure) {
  config_.spares = 1;
  Make(2, 1);
  Register(0);
  Register(1);
  Register(2);
  controller_->OnDisconnect(3);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(EventsOf("failure").size(), 0u);
  EXPECT_EQ(EventsOf("spare_lost").size(), 1u);
  // The job keeps its spare: the backend is asked for another (once its
  // explanation, asked off the lock, is in).
  controller_->Tick();
  EXPECT_EQ(provider_.replaced, std::vector<std::string>{"node2"});
  EXPECT_FALSE(Register(3)->closed);  // its place as a spare is free again
}

// Cordons are read off the controller's lock (at the start, every few
// seconds, with each incident's blame): one an operator makes while the job
// runs refuses the node from the next read on.
TEST_F(JobControllerTest, ACordonMadeDuringTheJobRefusesTheNodeFromTheNextReadOn) {
  Make(3, 1, 3);
  Register(0);
  ASSERT_EQ(controller_->state(), JobState::kStarting);
  ASSERT_TRUE(store_.SetNodeHealth({"node2", "cordoned", "operator: bad fan", "", 1}).ok());
  clock_.Advance(6 * kSecond);
  controller_->Tick();  // reads the store's node health again (inline here)
  controller_->Tick();  // and takes what it read
  FakeAgentLink* refused = Register(2);
  EXPECT_TRUE(refused->closed);
  ASSERT_NE(refused->Last(Kind::kWelcome), nullptr);
  EXPECT_NE(refused->Last(Kind::kWelcome)->welcome().error().find("node node2 is cordoned (operator: bad fan)"),
            std::string::npos);
  EXPECT_FALSE(Register(1)->closed);
}

TEST_F(JobControllerTest, ANodeCordonedDuringTheJobLeavesItAtTheRestart) {
  config_.spares = 1;
  Make(2, 1, 3);
  Register(0);
  FakeAgentLink* b = Register(1);
  FakeAgentLink* spare = Register(2);
  ASSERT_TRUE(store_.SetNodeHealth({"node1", "cordoned", "operator: bad fan", "", 1}).ok());
  Exit(0, 0, 0, 1);
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_TRUE(b->closed);
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node1"});
  ASSERT_NE(spare->Last(Kind::kStart), nullptr);
  EXPECT_EQ(spare->Last(Kind::kStart)->start().group_rank(), 1);
}

TEST_F(JobControllerTest, PreflightDiagnosesOneNodeAtATimeAndKeepsASlowNodeOut) {
  config_.diagnose = DiagnoseMode::kQuick;
  config_.diag_parallelism = 1;
  config_.spares = 1;
  Make(3, 1);
  FakeAgentLink* n0 = Register(0);
  FakeAgentLink* n1 = Register(1);
  FakeAgentLink* n2 = Register(2);
  EXPECT_EQ(controller_->state(), JobState::kDiagnosing);
  EXPECT_EQ(n0->Count(Kind::kRunDiagnostics), 1);
  EXPECT_EQ(n1->Count(Kind::kRunDiagnostics), 0);  // one at a time
  FakeAgentLink* spare = Register(3);              // arrives during the round: a spare, not asked
  Diagnosed(0, n0, 20);
  EXPECT_EQ(n1->Count(Kind::kRunDiagnostics), 1);
  Diagnosed(1, n1, 19);
  Diagnosed(2, n2, 9.5);  // under 70 % of the median (19)...
  EXPECT_FALSE(n2->closed);
  EXPECT_EQ(n0->Count(Kind::kRunDiagnostics), 2);  // ...so every node is measured again
  Diagnosed(0, n0, 21);
  Diagnosed(1, n1, 18);
  Diagnosed(2, n2, 9.6);
  EXPECT_EQ(n2->Count(Kind::kRunDiagnostics), 3);  // slow again: a third run, for it alone
  EXPECT_EQ(n0->Count(Kind::kRunDiagnostics), 2);
  Diagnosed(2, n2, 9.7);
  EXPECT_EQ(spare->Count(Kind::kRunDiagnostics), 0);
  EXPECT_TRUE(n2->closed);
  EXPECT_EQ(Stored().GetNodeHealth("node2")->status, "cordoned");
  auto evidence = Detail("node_evicted")["evidence"];
  EXPECT_EQ(evidence["purpose"], "preflight");
  EXPECT_NE(evidence["failures"][0].get<std::string>().find("of the median 19.00 of 3 nodes"), std::string::npos)
      << evidence.dump();
  EXPECT_EQ(Stored().LatestDiagnostics()->size(), 3u);
  // The spare takes group rank 2 and generation 0 starts.
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  ASSERT_NE(spare->Last(Kind::kStart), nullptr);
  EXPECT_EQ(spare->Last(Kind::kStart)->start().group_rank(), 2);
  EXPECT_EQ(n2->Count(Kind::kStart), 0);
  EXPECT_EQ(Detail("diagnosis")["evicted"], nlohmann::json::array({"node2"}));
}

TEST_F(JobControllerTest, AfterAFailureTheDiagnosedBadNodeIsEvictedAndASpareTakesItsPlace) {
  config_.diagnose = DiagnoseMode::kQuick;
  config_.spares = 1;
  Make(3, 1, 3);
  FakeAgentLink* n[4];
  for (int i = 0; i < 3; ++i) n[i] = Register(i);
  for (int i = 0; i < 3; ++i) Diagnosed(i, n[i], 20);  // preflight: all at once, all pass
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  n[3] = Register(3);  // a spare
  Exit(1, 0, 1, 0, 9);  // rank 1 killed
  for (int i = 0; i < 3; ++i) Stopped(i, 0);
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(n[i]->Count(Kind::kRunDiagnostics), i < 3 ? 2 : 1) << i;  // all at once
  Diagnosed(0, n[0], 20);
  Diagnosed(3, n[3], 21);
  Diagnosed(2, n[2], 19);
  EXPECT_EQ(controller_->state(), JobState::kDiagnosing);  // node1 has not answered
  Diagnosed(1, n[1], 10);
  EXPECT_EQ(EventsOf("diagnosis_confirming").size(), 1u);
  for (int i : {0, 2, 3}) Diagnosed(i, n[i], 20);
  Diagnosed(1, n[1], 9);  // slow again...
  Diagnosed(1, n[1], 9.5);  // ...and a third time; the best run is the evidence
  EXPECT_TRUE(n[1]->closed);
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node1"});
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(n[3]->Last(Kind::kStart)->start().group_rank(), 1);
  EXPECT_EQ(n[3]->Last(Kind::kStart)->start().generation(), 1);
  auto actions = Stored().NodeActions("node1").value();
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_NE(actions[0].reason.find("diagnostics (incident 1)"), std::string::npos) << actions[0].reason;
  EXPECT_EQ(nlohmann::json::parse(actions[0].evidence_json)["figures"][0]["value"], 10);
}

TEST_F(JobControllerTest, ANodeThatDoesNotAnswerItsDiagnosticsInTimeIsEvicted) {
  config_.diagnose = DiagnoseMode::kQuick;
  config_.diag_timeout = 30 * kSecond;
  Make(2, 1);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  Diagnosed(0, a, 20);
  clock_.Advance(29 * kSecond);
  controller_->Tick();
  EXPECT_FALSE(b->closed);
  clock_.Advance(2 * kSecond);
  controller_->Tick();
  EXPECT_TRUE(b->closed);
  EXPECT_EQ(controller_->state(), JobState::kStarting);  // waits for a node in its place
  EXPECT_NE(Detail("node_evicted")["reason"].get<std::string>().find("no diagnostics within 30 s"),
            std::string::npos);
}

TEST_F(JobControllerTest, ASuspectNodeIsAnnouncedWhenItJoinsTheNextJob) {
  ASSERT_TRUE(store_.SetNodeHealth({"node0", "suspect", "gpu_hardware: Xid 79", "old-job", 1}).ok());
  Make(1, 1);
  Register(0);
  auto warn = EventsOf("node_suspect");
  ASSERT_EQ(warn.size(), 1u);
  EXPECT_NE(warn[0].message.find("old-job"), std::string::npos);
}

TEST_F(JobControllerTest, HardwareHistoryOfANodeTurnsAVagueFailureIntoAnEviction) {
  Nanos day = 24 * 3600 * kSecond;
  ASSERT_TRUE(store_.RecordIncident({"old-job", 1, clock_.WallNanos() - day, "node1", 2,
                                     "gpu_hardware", "gpu-ecc", "evict_node", 5, "{}"}).ok());
  Make(2, 1, 3, true);
  Register(0);
  Register(1);
  Exit(1, 0, 1, 1, 0, 8, "something unclear");
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_NE(Detail("decision")["reason"].get<std::string>().find("earlier jobs"), std::string::npos);
}

TEST_F(JobControllerTest, OldOrClearedHardwareHistoryNoLongerCounts) {
  Nanos day = 24 * 3600 * kSecond;
  // Older than the suspicion window (7 days).
  ASSERT_TRUE(store_.RecordIncident({"old-job", 1, clock_.WallNanos() - 8 * day, "node1", 2,
                                     "gpu_hardware", "gpu-ecc", "evict_node", 5, "{}"}).ok());
  // Recent, but an operator cleared the node afterwards (trainguard uncordon).
  ASSERT_TRUE(store_.RecordIncident({"old-job", 2, clock_.WallNanos() - 2 * day, "node1", 2,
                                     "gpu_hardware", "gpu-ecc", "evict_node", 5, "{}"}).ok());
  ASSERT_TRUE(store_.SetNodeHealth({"node1", "ok", "cleared by an operator", "",
                                    clock_.WallNanos() - day}).ok());
  Make(2, 1, 3, true);
  Register(0);
  Register(1);
  Exit(1, 0, 1, 1, 0, 8, "something unclear");
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_EQ(Detail("decision")["decision"], "restart");
}

TEST_F(JobControllerTest, AnElasticJobGoesOnWithFewerNodesWhenNoReplacementComes) {
  config_.min_nnodes = 2;
  config_.elastic_wait = 20 * kSecond;
  provider_.replaces_evicted = false;
  Make(3, 2, 3, true);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  EXPECT_EQ(a->Count(Kind::kStart), 0);  // the first start waits for all three (or the elastic wait)
  FakeAgentLink* c = Register(2);
  ASSERT_EQ(c->Count(Kind::kStart), 1);
  EXPECT_EQ(c->Last(Kind::kStart)->start().world_size(), 6);
  // Node 1's GPU falls off the bus: evicted, nobody comes in its place.
  Exit(1, 0, 3, 0, 9, 12, "RuntimeError: CUDA error: unspecified launch failure", 0, kXid79);
  Stopped(0, 0);
  Stopped(1, 0);
  Stopped(2, 0);
  EXPECT_TRUE(b->closed);
  ASSERT_EQ(controller_->state(), JobState::kRunning);  // at once: nothing to wait for
  const v1::Start& on_a = a->Last(Kind::kStart)->start();
  const v1::Start& on_c = c->Last(Kind::kStart)->start();
  EXPECT_EQ(on_a.generation(), 1);
  EXPECT_EQ(on_a.nnodes(), 2);
  EXPECT_EQ(on_a.world_size(), 4);
  EXPECT_EQ(on_a.group_rank(), 0);
  EXPECT_EQ(on_c.group_rank(), 1);  // node2 moved down into the evicted node's place
  EXPECT_EQ(Detail("world_resized")["nnodes"], 2);
  EXPECT_EQ(Detail("group_ranks_renumbered")["moved"]["node2"], nlohmann::json::array({2, 1}));
  // The smaller world's four ranks exiting 0 end the job.
  for (int r : {0, 1}) Exit(0, 1, r, 0, 0, 20);
  for (int r : {2, 3}) Exit(2, 1, r, 0, 0, 20);
  EXPECT_EQ(controller_->state(), JobState::kSucceeded);
}

TEST_F(JobControllerTest, AnElasticJobWaitsForALostNodesReplacementThenGoesOnWithout) {
  config_.min_nnodes = 1;
  config_.elastic_wait = 20 * kSecond;
  Make(2, 1, 3);
  FakeAgentLink* a = Register(0);
  Register(1);
  Heartbeat(0, 0, {Rank(0, 5)});
  // Node 1 goes silent: lost, and the provider is asked for a replacement.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(1 * kSecond);
    Heartbeat(0, 0, {Rank(0, 5)});
    controller_->Tick();
  }
  Stopped(0, 0);
  EXPECT_EQ(provider_.replaced, std::vector<std::string>{"node1"});
  ASSERT_EQ(controller_->state(), JobState::kRestarting);
  auto waiting = EventsOf("waiting_for_nodes");
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_NE(waiting[0].message.find("goes on with 1 node(s) (--nnodes 1:2) unless a node joins within 20"),
            std::string::npos)
      << waiting[0].message;
  clock_.Advance(19 * kSecond);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRestarting);
  clock_.Advance(2 * kSecond);
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(a->Last(Kind::kStart)->start().world_size(), 1);
  EXPECT_EQ(EventsOf("waiting_for_nodes").size(), 1u);  // said once
}

TEST_F(JobControllerTest, BelowItsMinimumAnElasticJobWaitsThenFailsSayingWhy) {
  config_.min_nnodes = 2;
  config_.elastic_wait = 20 * kSecond;
  provider_.replaces_evicted = false;
  Make(3, 1, 3, true);
  FakeAgentLink* a = Register(0);
  Register(1);
  controller_->Tick();
  EXPECT_EQ(a->Count(Kind::kStart), 0);
  clock_.Advance(21 * kSecond);  // the third node never comes: the job starts with two
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(a->Last(Kind::kStart)->start().world_size(), 2);
  Exit(1, 0, 1, 0, 9, 12, "RuntimeError: CUDA error: unspecified launch failure", 0, kXid79);
  Stopped(0, 0);
  Stopped(1, 0);
  ASSERT_EQ(controller_->state(), JobState::kRestarting);
  EXPECT_NE(EventsOf("waiting_for_nodes").at(0).message.find("the job needs 2"), std::string::npos);
  clock_.Advance(31 * kSecond);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_NE(controller_->summary().find("(at least 2 needed)"), std::string::npos) << controller_->summary();
}
TEST_F(JobControllerTest, AfterItsOwnProbesEachNodeRunsAnAllToAllThenEachRackAnAllReduce) {
  config_.diagnose = DiagnoseMode::kQuick;
  config_.diag_parallelism = 1;  // nodes share a host: one node, then one rack, at a time
  Make(4, 2);  // the job runs `python3 train.py`
  FakeAgentLink* n[4];
  for (int i = 0; i < 4; ++i) n[i] = Register(i, kProtocolVersion, i < 2 ? "rackA" : "rackB");
  for (int i = 0; i < 4; ++i) Diagnosed(i, n[i], 20);
  // The all-to-all stage, node by node, with the node's rank count and the job's interpreter.
  const auto& a2a = n[0]->Last(Kind::kRunDiagnostics)->run_diagnostics();
  ASSERT_TRUE(a2a.collective());
  EXPECT_EQ(a2a.local_ranks(), 2);
  EXPECT_EQ(a2a.rack_size(), 0);
  EXPECT_EQ(a2a.python(), "python3");
  EXPECT_EQ(n[1]->Count(Kind::kRunDiagnostics), 1);  // not yet
  for (int i = 0; i < 4; ++i) Collective(i, n[i], {{{"name", "alltoall_gbps"}, {"value", 2.0 + 0.1 * i}}});
  // The rack stage: rackA's two nodes together, the first one's free port as the rendezvous.
  const auto& ar = n[1]->Last(Kind::kRunDiagnostics)->run_diagnostics();
  EXPECT_EQ(ar.local_ranks(), 0);
  EXPECT_EQ(ar.rack_rank(), 1);
  EXPECT_EQ(ar.rack_size(), 2);
  EXPECT_EQ(ar.rack_master(), "10.0.0.0:60000");  // node0's port from its all-to-all answer
  EXPECT_EQ(n[2]->Count(Kind::kRunDiagnostics), 2);  // rackB waits for rackA
  // A rack's all-reduce that failed is shown, and evicts nobody.
  Collective(0, n[0], {{{"name", "rack_allreduce_gbps"}, {"value", 0}, {"error", "rendezvous timed out"}}});
  Collective(1, n[1], {{{"name", "rack_allreduce_gbps"}, {"value", 0}, {"error", "rendezvous timed out"}}});
  EXPECT_EQ(n[2]->Last(Kind::kRunDiagnostics)->run_diagnostics().rack_master(), "10.0.0.2:60002");
  Collective(2, n[2], {{{"name", "rack_allreduce_gbps"}, {"value", 1.5}}});
  Collective(3, n[3], {{{"name", "rack_allreduce_gbps"}, {"value", 1.5}}});
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_TRUE(EventsOf("node_evicted").empty());
  // Every figure is in the node's record, and the next master port is the new one.
  auto figures = nlohmann::json::parse(Stored().LatestDiagnostics()->at(0).figures_json);
  EXPECT_EQ(n[0]->Last(Kind::kStart)->start().master_port(), 60000);
  EXPECT_EQ(EventsOf("diagnostics").size(), 12u);  // 4 nodes x 3 stages
  EXPECT_NE(EventsOf("diagnostics").at(4).message.find("(all-to-all)"), std::string::npos);
}

TEST_F(JobControllerTest, AnAllToAllThatDeliversWrongDataEvictsItsNode) {
  config_.diagnose = DiagnoseMode::kQuick;
  Make(3, 2);
  FakeAgentLink* n[3];
  for (int i = 0; i < 3; ++i) n[i] = Register(i);
  for (int i = 0; i < 3; ++i) Diagnosed(i, n[i], 20);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(n[i]->Last(Kind::kRunDiagnostics)->run_diagnostics().collective());
  Collective(0, n[0], {{{"name", "alltoall_gbps"}, {"value", 2.0}}});
  Collective(1, n[1], {{{"name", "alltoall_gbps"}, {"value", 0},
                        {"error", "all-to-all delivered wrong data: local rank 0 from local rank 1"}}});
  Collective(2, n[2], {{{"name", "alltoall_gbps"}, {"value", 2.1}}});
  // No racks: no rack stage; node1 is evicted with the probe's words.
  EXPECT_TRUE(n[1]->closed);
  EXPECT_NE(Detail("node_evicted")["reason"].get<std::string>().find("from local rank 1"), std::string::npos);
}

TEST_F(JobControllerTest, ANodeWithGpusGetsItsOwnStageForTheirComputeAndCopies) {
  config_.diagnose = DiagnoseMode::kQuick;
  Make(2, 1);
  FakeAgentLink* n[2];
  for (int i = 0; i < 2; ++i) n[i] = Register(i);
  Diagnosed(0, n[0], 20);  // no GPU
  v1::AgentMessage m;      // node1's suite lists 8 GPUs
  m.mutable_diagnostics()->set_round(n[1]->Last(Kind::kRunDiagnostics)->run_diagnostics().round());
  m.mutable_diagnostics()->set_figures_json(
      nlohmann::json::array({{{"name", "compute_gflops"}, {"value", 20}}, {{"name", "gpu_count"}, {"value", 8}}}).dump());
  controller_->OnMessage(2, m);
  EXPECT_EQ(n[0]->Count(Kind::kRunDiagnostics), 1);  // one rank, no GPU: no stage of its own
  const auto& order = n[1]->Last(Kind::kRunDiagnostics)->run_diagnostics();
  EXPECT_TRUE(order.collective());
  EXPECT_TRUE(order.gpu());
  Collective(1, n[1], {{{"name", "gpu_gemm_tflops:0"}, {"value", 700}}});
  EXPECT_EQ(controller_->state(), JobState::kRunning);
}

// A controller that died (kill -9) and is started again on the same store.

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

constexpr const char* kLaunchFailure = "RuntimeError: CUDA error: unspecified launch failure";

// GPU 1's Xid count is `xids`, the newest `last`; GPU 0 has none.
std::function<void(int, v1::GpuHealth*)> Xids(std::int64_t xids, std::int64_t last) {
  return [=](int i, v1::GpuHealth* g) {
    g->set_xid_events(i == 1 ? xids : 0);
    g->set_last_xid(i == 1 ? last : -1);
  };
}

TEST_F(JobControllerTest, ALaunchFailureInTheLogAloneDiagnosesItsNodeAndRestartsWithoutEvictingIt) {
  Make(2, 2, 3, true);  // routine diagnosis off
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  Exit(1, 0, 3, 1, 0, 12, kLaunchFailure);
  Stopped(0, 0);
  Stopped(1, 0);
  auto attribution = Detail("attribution");
  EXPECT_EQ(attribution["category"], "gpu_hardware");
  EXPECT_EQ(attribution["decision"], "restart");
  EXPECT_EQ(attribution["suspected_nodes"], nlohmann::json::array({"node1"}));
  EXPECT_EQ(attribution["corroboration"]["unsupported"], nlohmann::json::array({"node1"}));
  EXPECT_NE(Detail("decision")["reason"].get<std::string>().find("suspected, diagnosing it"), std::string::npos);
  // The suspect alone is diagnosed, with the quick suite.
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing);
  EXPECT_EQ(a->Count(Kind::kRunDiagnostics), 0);
  ASSERT_EQ(b->Count(Kind::kRunDiagnostics), 1);
  EXPECT_EQ(b->Last(Kind::kRunDiagnostics)->run_diagnostics().mode(), "quick");
  Diagnosed(1, b, 20);  // clean: its own probes...
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing);
  Collective(1, b, {{{"name", "alltoall_gbps"}, {"value", 2.0}}});  // ...and its ranks' all-to-all
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_TRUE(provider_.evicted.empty());
  EXPECT_FALSE(b->closed);
  auto actions = Stored().NodeActions("node1").value();
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].action, "suspected");

  // The same GPU fails the same way later in the run: evicted.
  Exit(1, 1, 3, 1, 0, 60, kLaunchFailure);
  Stopped(0, 1);
  Stopped(1, 1);
  EXPECT_EQ(Detail("decision", 1)["decision"], "evict_node");
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node1"});
  EXPECT_NE(Detail("decision", 1)["reason"].get<std::string>().find("failed so before at another step"),
            std::string::npos);
}

TEST_F(JobControllerTest, ALaunchFailureOnANodeWhoseHeartbeatShowedAnXidEvictsAtOnceMoreSurely) {
  Make(2, 2, 3, true);
  Register(0);
  FakeAgentLink* b = Register(1);
  GpuHeartbeat(1, 2, Xids(0, -1));
  GpuHeartbeat(1, 2, Xids(1, 79));
  ASSERT_EQ(EventsOf("gpu_errors").size(), 1u);
  Exit(1, 0, 3, 1, 0, 12, kLaunchFailure);
  Stopped(0, 0);
  Stopped(1, 0);
  auto attribution = Detail("attribution");
  EXPECT_EQ(attribution["decision"], "evict_node");
  EXPECT_EQ(attribution["corroboration"]["support"]["node1"][0], "heartbeat: GPU 1: Xid 79 (1 new)");
  EXPECT_EQ(attribution["confidence"], kCorroboratedConfidence);
  EXPECT_LT(attribution["confidence_from_log"].get<double>(), kCorroboratedConfidence);
  EXPECT_TRUE(b->closed);
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node1"});
}

TEST_F(JobControllerTest, AnApplicationsXidInTheHeartbeatCorroboratesNothing) {
  Make(2, 2, 3, true);
  Register(0);
  Register(1);
  GpuHeartbeat(1, 2, Xids(0, -1));
  GpuHeartbeat(1, 2, Xids(1, 31));
  EXPECT_TRUE(EventsOf("gpu_errors").empty());
  Exit(1, 0, 3, 1, 0, 12, kLaunchFailure);
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_EQ(Detail("decision")["decision"], "restart");
  EXPECT_TRUE(provider_.evicted.empty());
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

TEST_F(JobControllerTest, ARankThatSurvivedSigkillIsSaidKeptWithItsNodeAndReadAsTheIncidentsEvidence) {
  Make(2, 2, 3, true);
  Register(0);
  Register(1);
  Exit(1, 0, 3, 1, 0, 12, "Traceback: boom");
  Stopped(0, 0);
  v1::AgentMessage m;
  m.mutable_stopped()->set_generation(0);
  v1::Unkillable* u = m.mutable_stopped()->add_unkillable();
  u->set_global_rank(2);
  u->set_pid(4242);
  u->set_proc_state("D");
  u->set_wchan("__iomap_dio_rw");
  u->set_syscall("preadv2");
  u->set_on_file(true);
  controller_->OnMessage(conn_base_ + 1, m);
  auto said = EventsOf("rank_unkillable");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_EQ(said[0].rank, 2);
  EXPECT_EQ(said[0].message,
            "rank 2 on node1 (pid 4242) survived SIGKILL in state D, blocked in preadv2 on a file (kernel: "
            "__iomap_dio_rw)");
  EXPECT_EQ(Detail("rank_unkillable")["syscall"], "preadv2");
  controller_->Tick();
  auto actions = Stored().NodeActions("node1").value();
  ASSERT_FALSE(actions.empty());
  EXPECT_EQ(actions.back().action, "unkillable");
  // The incident reads it as its rank's line.
  auto evidence = Detail("attribution")["evidence"];
  bool seen = false;
  for (const auto& e : evidence) seen = seen || e["line"].get<std::string>().find("survived SIGKILL") != std::string::npos;
  EXPECT_TRUE(seen) << evidence.dump();
}

}  // namespace
}  // namespace trainguard
