// JobController: registration, the lifecycle, crashes, hangs, lost nodes,
// downtime, the recovery policy's loop guards.
#include "controller/job_controller_test_fixture.h"

namespace trainguard {
namespace {

// A controller with standbys (docs/standby.md): every message to an agent
// carries its lead, and its Welcome says how long a silence counts as its
// loss. Without them, neither.
TEST_F(JobControllerTest, ALeadersMessagesCarryItsLeadAndItsWelcomeTheSilenceThatEndsIt) {
  config_.lead_epoch = 3;
  Make(1, 1);
  FakeAgentLink* a = Register(0);
  ASSERT_NE(a->Last(Kind::kWelcome), nullptr);
  EXPECT_EQ(a->Last(Kind::kWelcome)->lead_epoch(), 3);
  EXPECT_EQ(a->Last(Kind::kWelcome)->welcome().silence_ms(), 6000);
  ASSERT_NE(a->Last(Kind::kStart), nullptr);
  EXPECT_EQ(a->Last(Kind::kStart)->lead_epoch(), 3);
}

TEST_F(JobControllerTest, AControllerWithoutStandbysStampsNoLead) {
  Make(1, 1);
  FakeAgentLink* a = Register(0);
  ASSERT_NE(a->Last(Kind::kWelcome), nullptr);
  EXPECT_EQ(a->Last(Kind::kWelcome)->lead_epoch(), 0);
  EXPECT_EQ(a->Last(Kind::kWelcome)->welcome().silence_ms(), 0);
}

TEST_F(JobControllerTest, StartsWhenAllNodesRegistered) {
  Make();
  FakeAgentLink* a = Register(0);
  EXPECT_EQ(a->Count(Kind::kStart), 0);
  EXPECT_EQ(controller_->state(), JobState::kStarting);
  FakeAgentLink* b = Register(1);
  ASSERT_NE(a->Last(Kind::kStart), nullptr);
  ASSERT_NE(b->Last(Kind::kStart), nullptr);
  const v1::Start& sa = a->Last(Kind::kStart)->start();
  const v1::Start& sb = b->Last(Kind::kStart)->start();
  EXPECT_EQ(sa.group_rank(), 0);
  EXPECT_EQ(sb.group_rank(), 1);
  EXPECT_EQ(sa.world_size(), 4);
  EXPECT_EQ(sa.master_addr(), "10.0.0.0");
  EXPECT_EQ(sb.master_port(), 40000);
  EXPECT_EQ(sa.generation(), 0);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
}

TEST_F(JobControllerTest, ANodeGetsThePreferredGroupRankIfFree) {
  Make(3, 1);
  auto reg = [&](int conn, const std::string& id, int preferred) {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(conn, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(kProtocolVersion);
    m.mutable_register_()->set_node_id(id);
    m.mutable_register_()->set_preferred_group_rank(preferred);
    controller_->OnMessage(conn, m);
    return link.get();
  };
  FakeAgentLink* b = reg(1, "b", 2);
  FakeAgentLink* a = reg(2, "a", 2);   // taken: gets the lowest free slot
  FakeAgentLink* c = reg(3, "c", 7);   // out of range: ignored
  EXPECT_EQ(b->Last(Kind::kStart)->start().group_rank(), 2);
  EXPECT_EQ(a->Last(Kind::kStart)->start().group_rank(), 0);
  EXPECT_EQ(c->Last(Kind::kStart)->start().group_rank(), 1);
}

TEST_F(JobControllerTest, RefusesAProtocolVersionMismatch) {
  Make();
  FakeAgentLink* a = Register(0, kProtocolVersion + 1);
  ASSERT_NE(a->Last(Kind::kWelcome), nullptr);
  EXPECT_NE(a->Last(Kind::kWelcome)->welcome().error().find("protocol version mismatch"),
            std::string::npos);
  EXPECT_TRUE(a->closed);
  EXPECT_EQ(EventsOf("agent_refused").size(), 1u);
}

TEST_F(JobControllerTest, WithAJobSecretAnAgentMustShowIt) {
  config_.agent_secret = "0123456789abcdef";
  Make();
  auto attempt = [&](int conn, const std::string& secret) {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(conn, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(kProtocolVersion);
    m.mutable_register_()->set_node_id("node" + std::to_string(conn - 1));
    m.mutable_register_()->set_address("10.0.0.1");
    m.mutable_register_()->set_job_secret(secret);
    controller_->OnMessage(conn, m);
    return link.get();
  };
  FakeAgentLink* none = attempt(1, "");
  ASSERT_NE(none->Last(Kind::kWelcome), nullptr);
  EXPECT_NE(none->Last(Kind::kWelcome)->welcome().error().find("it showed no job secret: start it with --secret-file"),
            std::string::npos)
      << none->Last(Kind::kWelcome)->welcome().error();
  EXPECT_TRUE(none->closed);
  FakeAgentLink* wrong = attempt(2, "0123456789abcdeF");
  EXPECT_NE(wrong->Last(Kind::kWelcome)->welcome().error().find("its job secret is wrong"), std::string::npos);
  EXPECT_TRUE(wrong->closed);
  auto refused = EventsOf("agent_refused");
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_EQ(refused[0].message.find("0123456789abcdef"), std::string::npos);  // never written down
  FakeAgentLink* right = attempt(3, "0123456789abcdef");
  ASSERT_NE(right->Last(Kind::kWelcome), nullptr);
  EXPECT_TRUE(right->Last(Kind::kWelcome)->welcome().error().empty());
  EXPECT_FALSE(right->closed);
}

TEST_F(JobControllerTest, AnotherHostWithTheSameNodeIdIsRefusedNotTakenForARestart) {
  Make(2, 1);
  auto reg = [&](int conn, const std::string& address) {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(conn, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(kProtocolVersion);
    m.mutable_register_()->set_node_id("gpu-host");
    m.mutable_register_()->set_address(address);
    controller_->OnMessage(conn, m);
    return link.get();
  };
  FakeAgentLink* first = reg(1, "10.0.0.1");
  FakeAgentLink* twin = reg(2, "10.0.0.2");  // same hostname, another host
  EXPECT_TRUE(first->Last(Kind::kWelcome)->welcome().error().empty());
  EXPECT_FALSE(first->closed);
  EXPECT_NE(twin->Last(Kind::kWelcome)->welcome().error().find("give every host its own node id"),
            std::string::npos);
  EXPECT_TRUE(twin->closed);
  FakeAgentLink* restarted = reg(3, "10.0.0.1");  // the same host's agent, restarted
  EXPECT_TRUE(restarted->Last(Kind::kWelcome)->welcome().error().empty());
  EXPECT_TRUE(first->closed);
}

TEST_F(JobControllerTest, AgentsThatRegisterBeforeStartAreWelcomedByIt) {
  config_.job_id = "early";
  config_.nnodes = 1;
  config_.nproc_per_node = 1;
  config_.argv = {"true"};
  controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_, nullptr);
  controller_->SetOffLockThreads(0);
  auto link = std::make_shared<FakeAgentLink>();
  links_.push_back(link);
  controller_->OnConnect(1, link);
  v1::AgentMessage m;
  m.mutable_register_()->set_protocol_version(kProtocolVersion);
  m.mutable_register_()->set_node_id("n");
  controller_->OnMessage(1, m);
  EXPECT_EQ(link->Last(Kind::kWelcome), nullptr);
  ASSERT_TRUE(controller_->Start().ok());
  ASSERT_NE(link->Last(Kind::kWelcome), nullptr);
  EXPECT_NE(link->Last(Kind::kStart), nullptr);
  auto events = Stored().Events("early");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->front().kind, "job_created");  // the job exists before its first node
}

TEST_F(JobControllerTest, RefusesANodeBeyondTheJobSize) {
  Make(1, 1);
  Register(0);
  FakeAgentLink* extra = Register(1);
  EXPECT_FALSE(extra->Last(Kind::kWelcome)->welcome().error().empty());
  EXPECT_TRUE(extra->closed);
}

TEST_F(JobControllerTest, SucceedsWhenEveryRankExitsZero) {
  Make(2, 1);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  Exit(0, 0, 0, 0);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  Exit(1, 0, 1, 0);
  EXPECT_EQ(controller_->state(), JobState::kSucceeded);
  EXPECT_EQ(a->Count(Kind::kShutdown), 1);
  EXPECT_EQ(b->Count(Kind::kShutdown), 1);
  EXPECT_EQ(Stored().Jobs().value()[0].state, "SUCCEEDED");
}

TEST_F(JobControllerTest, CrashStopsEveryNodeThenRestartsWithANewGeneration) {
  Make();
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  Exit(1, 0, 3, 1);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  ASSERT_NE(a->Last(Kind::kStop), nullptr);
  ASSERT_NE(b->Last(Kind::kStop), nullptr);
  EXPECT_EQ(a->Last(Kind::kStop)->stop().generation(), 0);
  auto failures = EventsOf("failure");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].rank, 3);
  EXPECT_NE(failures[0].message.find("Traceback: boom"), std::string::npos);
  // Ranks that die because of the stop are not new failures.
  Exit(0, 0, 0, 1);
  EXPECT_EQ(EventsOf("failure").size(), 1u);
  Stopped(0, 0);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  Stopped(1, 0);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(controller_->restart_count(), 1);
  EXPECT_EQ(a->Count(Kind::kStart), 2);
  EXPECT_EQ(a->Last(Kind::kStart)->start().generation(), 1);
  EXPECT_EQ(a->Last(Kind::kStart)->start().master_port(), 50000);  // fresh port from node 0
}

TEST_F(JobControllerTest, AnExitOfAnOldGenerationIsIgnored) {
  Make(1, 1);
  Register(0);
  Exit(0, 0, 0, 1);
  Stopped(0, 0);
  ASSERT_EQ(controller_->restart_count(), 1);
  Exit(0, 0, 0, 1);  // late report from generation 0
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(EventsOf("failure").size(), 1u);
}

TEST_F(JobControllerTest, FailsWithASummaryAfterMaxRestarts) {
  Make(1, 1, /*max_restarts=*/1);
  FakeAgentLink* a = Register(0);
  Exit(0, 0, 0, 2);
  Stopped(0, 0);
  Exit(0, 1, 0, 2);
  Stopped(0, 1);
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_NE(controller_->summary().find("FAILED after 1 restart(s)"), std::string::npos);
  EXPECT_NE(controller_->summary().find("exited with code 2"), std::string::npos);
  EXPECT_EQ(a->Count(Kind::kShutdown), 1);
  EXPECT_EQ(Stored().Jobs().value()[0].state, "FAILED");
}

TEST_F(JobControllerTest, HangIsDetectedOnlyAfterTheTimeout) {
  Make(1, 2);
  FakeAgentLink* a = Register(0);
  Heartbeat(0, 0, {Rank(0, 5, 0), Rank(1, 5, 0)});
  clock_.Advance(config_.hang_timeout - kMillisecond);
  // Rank 0 keeps stepping; rank 1 does not.
  Heartbeat(0, 0, {Rank(0, 9, 0), Rank(1, 5, (config_.hang_timeout - kMillisecond) / kMillisecond)});
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  clock_.Advance(2 * kMillisecond);
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  const v1::Stop& stop = a->Last(Kind::kStop)->stop();
  ASSERT_EQ(stop.capture_stacks_of_size(), 1);
  EXPECT_EQ(stop.capture_stacks_of(0), 1);
  auto failure = EventsOf("failure").at(0);
  EXPECT_EQ(failure.rank, 1);
  auto d = nlohmann::json::parse(failure.detail_json);
  EXPECT_EQ(d["failure_kind"], "hang");
  EXPECT_NEAR(d["detection_ms"].get<double>(), 10001, 2);
}

TEST_F(JobControllerTest, AStuckRankALaterHeartbeatLeavesOutIsStillFoundHungOnTime) {
  // Each node keeps the earliest hang deadline of its ranks, and the
  // detector's full pass runs only once that passed: heartbeats that move
  // the node's other rank on must not move the stuck one's deadline.
  Make(2, 2);
  Register(0);
  Register(1);
  Heartbeat(0, 0, {Rank(0, 5, 0), Rank(1, 5, 0)});
  Heartbeat(1, 0, {Rank(2, 5, 0), Rank(3, 5, 0)});
  controller_->Tick();
  for (int i = 1; i <= 9; ++i) {  // rank 1 says nothing more; everyone else steps
    clock_.Advance(config_.hang_timeout / 10);
    Heartbeat(0, 0, {Rank(0, 5 + i, 0)});
    Heartbeat(1, 0, {Rank(2, 5 + i, 0), Rank(3, 5 + i, 0)});
    controller_->Tick();
    ASSERT_EQ(controller_->state(), JobState::kRunning) << i;
  }
  clock_.Advance(config_.hang_timeout / 10 + kMillisecond);
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  EXPECT_EQ(EventsOf("failure").at(0).rank, 1);
}

TEST_F(JobControllerTest, StartupGetsItsOwnAllowance) {
  Make(1, 1);
  Register(0);
  // The agent keeps sending heartbeats; the rank never steps.
  auto advance = [&](Nanos total) {
    for (Nanos t = 0; t < total && controller_->state() == JobState::kRunning; t += kSecond) {
      clock_.Advance(kSecond);
      Nanos age = clock_.MonotonicNanos() - kSecond;
      Heartbeat(0, 0, {Rank(0, -1, age / kMillisecond)});
      controller_->Tick();
    }
  };
  advance(config_.hang_timeout * 2);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  advance(config_.startup_timeout);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  EXPECT_EQ(EventsOf("node_lost").size(), 0u);
}

TEST_F(JobControllerTest, RanksWithoutTheClientAreNeverCalledHung) {
  Make(1, 1);
  Register(0);
  v1::RankStatus r = Rank(0, -1, 0);
  r.set_attached(false);
  Heartbeat(0, 0, {r});
  clock_.Advance(config_.startup_timeout * 10);
  Heartbeat(0, 0, {r});
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
}

// A controller held up for 10 s (its lock taken, its messages queued in
// the transport) does not blame the nodes: the transport stamped their
// messages on arrival, and that is what silence is measured from.
TEST_F(JobControllerTest, ABusyControllerLosesNoNodeWhoseMessagesArrived) {
  Make();
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  Heartbeat(0, 0, {Rank(0, 1), Rank(1, 1)});
  Heartbeat(1, 0, {Rank(2, 1), Rank(3, 1)});
  for (int s = 0; s < 10; ++s) {  // the transport goes on receiving; the controller handles nothing
    clock_.Advance(kSecond);
    a->heard = b->heard = clock_.MonotonicNanos();
  }
  controller_->Tick();
  EXPECT_TRUE(EventsOf("node_lost").empty());
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  // Node 1's messages stop arriving: it is lost after the limit (3 s).
  for (int s = 0; s < 4; ++s) {
    clock_.Advance(kSecond);
    a->heard = clock_.MonotonicNanos();
    controller_->Tick();
  }
  auto lost = EventsOf("node_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].node, "node1");
}

// A controller that did not run at all for 10 s (its process frozen: the
// transport stamped nothing either) counts every node's silence afresh
// from the tick that ended the gap, and records that it stalled; a node
// silent for the limit after that is lost as usual.
TEST_F(JobControllerTest, AFrozenControllerCountsSilenceAfreshAfterTheGap) {
  config_.watch_gap_grace = kSecond;
  Make();
  Register(0);
  Register(1);
  Heartbeat(0, 0, {Rank(0, 1), Rank(1, 1)});
  Heartbeat(1, 0, {Rank(2, 1), Rank(3, 1)});
  controller_->Tick();
  clock_.Advance(10 * kSecond);
  controller_->Tick();
  EXPECT_TRUE(EventsOf("node_lost").empty());
  ASSERT_EQ(EventsOf("controller_stalled").size(), 1u);
  EXPECT_EQ(Detail("controller_stalled")["gap_ms"], 10000);
  for (int ms = 0; ms < 3000; ms += 50) {  // node 0 goes on; node 1 stays silent
    clock_.Advance(50 * kMillisecond);
    if (ms % 1000 == 0) Heartbeat(0, 0, {Rank(0, 2), Rank(1, 2)});
    controller_->Tick();
  }
  EXPECT_TRUE(EventsOf("node_lost").empty()) << "3 s after the gap is the limit, not past it";
  clock_.Advance(50 * kMillisecond);
  controller_->Tick();
  auto lost = EventsOf("node_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].node, "node1");
  EXPECT_EQ(EventsOf("controller_stalled").size(), 1u);
}

// A node that left the job keeps what it last reported; none of it may
// stand for a later generation (trainguard sim found an evicted node's old
// step taken as every later failure's step: lost work and the restart-storm
// guard were computed from it).
TEST_F(JobControllerTest, ANodeGoneFromTheJobLendsNoStepToALaterFailure) {
  Make();
  Register(0);
  Register(1);
  Heartbeat(1, 0, {Rank(2, 100), Rank(3, 100)});
  clock_.Advance(2 * kSecond);
  Heartbeat(0, 0, {Rank(0, 100), Rank(1, 100)});
  clock_.Advance(kSecond + kMillisecond);  // node1 is lost
  controller_->Tick();
  Stopped(0, 0);
  controller_->OnDisconnect(2);
  Register(2);  // its replacement
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  Heartbeat(0, 1, {Rank(0, 40), Rank(1, 40)});
  Heartbeat(2, 1, {Rank(2, 40), Rank(3, 40)});
  Exit(0, 1, 0, 1, 0, 40);
  auto failures = EventsOf("failure");
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(failures[1].detail_json)["failure_step"], 40) << failures[1].detail_json;
}

TEST_F(JobControllerTest, MissedHeartbeatsLoseTheNodeAndReplaceIt) {
  Make();
  Register(0);
  FakeAgentLink* b = Register(1);
  clock_.Advance(2 * kSecond);
  Heartbeat(0, 0, {Rank(0, 1), Rank(1, 1)});
  clock_.Advance(kSecond + kMillisecond);  // node1: 3 s + 1 ms without a heartbeat
  controller_->Tick();
  auto lost = EventsOf("node_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].node, "node1");
  EXPECT_NE(lost[0].message.find("no heartbeat"), std::string::npos);
  EXPECT_TRUE(b->closed);
  EXPECT_EQ(provider_.replaced, std::vector<std::string>{"node1"});
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  // Node 0 stops; the replacement registers and the job restarts.
  Stopped(0, 0);
  EXPECT_EQ(controller_->state(), JobState::kRestarting);
  controller_->OnDisconnect(2);
  FakeAgentLink* replacement = Register(1);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(replacement->Last(Kind::kStart)->start().group_rank(), 1);
  EXPECT_EQ(replacement->Last(Kind::kStart)->start().generation(), 1);
}

TEST_F(JobControllerTest, ANodeThatDoesNotReportStoppedIsLost) {
  Make();
  Register(0);
  Register(1);
  Exit(0, 0, 0, 1);
  Stopped(0, 0);
  clock_.Advance(config_.stop_timeout + kMillisecond);
  Heartbeat(0, 0, {});
  Heartbeat(1, 0, {});  // alive, but never reports its ranks stopped
  controller_->Tick();
  auto lost = EventsOf("node_lost");
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].node, "node1");
  EXPECT_EQ(controller_->state(), JobState::kRestarting);
}

TEST_F(JobControllerTest, RendezvousTimesOut) {
  Make();
  Register(0);
  clock_.Advance(config_.rendezvous_timeout + kMillisecond);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_NE(controller_->summary().find("only 1 of 2 nodes"), std::string::npos);
}

TEST_F(JobControllerTest, DowntimeOfAnIncidentIsAccounted) {
  Make(1, 1);
  Register(0);
  v1::RankStatus r = Rank(0, 25);
  r.set_checkpoint_step(20);
  Heartbeat(0, 0, {r});
  clock_.Advance(kSecond);
  Exit(0, 0, 0, 1, 0, 25);         // exit reported at the fault time: detection 0
  clock_.Advance(2 * kSecond);     // shutdown takes 2 s
  Stopped(0, 0);
  clock_.Advance(3 * kSecond);     // the new generation steps 3 s later
  v1::RankStatus first = Rank(0, 21);
  first.set_first_step_unix_ms(clock_.WallNanos() / kMillisecond);
  first.set_first_step(21);
  Heartbeat(0, 1, {first});
  auto downtime = EventsOf("downtime");
  ASSERT_EQ(downtime.size(), 1u);
  auto d = nlohmann::json::parse(downtime[0].detail_json);
  EXPECT_EQ(d["detection_ms"], 0);
  EXPECT_EQ(d["shutdown_ms"], 2000);
  EXPECT_EQ(d["restart_ms"], 3000);
  EXPECT_EQ(d["failure_step"], 25);
  EXPECT_EQ(d["checkpoint_step"], 20);
  EXPECT_EQ(d["lost_steps"], 5);
}

TEST_F(JobControllerTest, CancelFailsTheJobAndShutsAgentsDown) {
  Make(1, 1);
  FakeAgentLink* a = Register(0);
  controller_->Cancel("interrupted");
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_EQ(a->Count(Kind::kShutdown), 1);
  EXPECT_TRUE(controller_->WaitFinished(std::chrono::milliseconds(0)));
}

TEST_F(JobControllerTest, ADeterministicUserErrorStopsAtItsFirstRepeat) {
  Make(1, 2, /*max_restarts=*/5, /*attribute=*/true);
  Register(0);
  for (int gen = 0; gen < 2; ++gen) {
    Exit(0, gen, 1, 1, 0, 41, "ValueError: Expected input batch_size (4) to match target batch_size (1).");
    Stopped(0, gen);
  }
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_EQ(controller_->restart_count(), 1);  // not all 5
  EXPECT_NE(controller_->summary().find("deterministic"), std::string::npos) << controller_->summary();
  EXPECT_EQ(Detail("attribution")["category"], "user_code");
  EXPECT_EQ(Detail("decision", 0)["decision"], "restart");
  EXPECT_EQ(Detail("decision", 1)["decision"], "stop");
}

TEST_F(JobControllerTest, ARankThatRaisedButExitedAfterItsPeerIsStillTheCulprit) {
  // Rank 1 raised (its error file is written) and was still tearing down
  // when rank 0 lost its connection to it and exited first. The stop brings
  // rank 1's error file: the attribution names rank 1, not the symptom.
  Make(1, 2, /*max_restarts=*/0, /*attribute=*/true);
  Register(0);
  Exit(0, 0, 0, 1, 0, 3, "RuntimeError: [../gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4242");
  v1::AgentMessage m;
  auto* st = m.mutable_stopped();
  st->set_generation(0);
  auto* r = st->add_ranks();
  r->set_generation(0);
  *r->mutable_rank() = Rank(1, 3);
  r->add_log_tail("tracker: uploading run summary part 40/40");
  r->mutable_error()->set_message("ValueError: shard 1 of step 3 has a corrupt header (magic 0x0000)");
  r->mutable_error()->set_type("ValueError");
  r->mutable_error()->set_traceback("Traceback (most recent call last):\n  File \"train.py\", line 9, in load_shard\n");
  controller_->OnMessage(conn_base_, m);
  ASSERT_EQ(controller_->state(), JobState::kFailed);
  auto a = Detail("attribution");
  EXPECT_EQ(a["category"], "user_code") << a.dump();
  EXPECT_EQ(a["culprit_ranks"], nlohmann::json::array({1})) << a.dump();
  EXPECT_EQ(a["culprit_error_file"]["type"], "ValueError") << a.dump();
}

// Timings go into the store on the controller's clock: a node whose clock is
// 5 s ahead (measured by a clock probe with a 2 ms round trip) has 5 s taken
// off; an offset within the probe's uncertainty is left alone.
TEST_F(JobControllerTest, ASigkillWithoutOomEvidenceIsNotAnOom) {
  Make(2, 1, 3, true);
  Register(0);
  Register(1);
  Exit(1, 0, 1, 0, 9, 8, "step 8 done");
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_EQ(Detail("attribution")["category"], "other");
  EXPECT_EQ(Detail("attribution")["rule"], "killed-sigkill");
}

TEST_F(JobControllerTest, AnAgentThatExitedOnALiveHostDoesNotMakeTheNodeSuspect) {
  provider_.explanation = {"the agent of node node1 was killed by signal 9 while its host stayed up: "
                           "a fault of the agent process, not of the node",
                           AgentExitedVerdict()};
  Make(2, 1, 3, true);
  Register(0);
  Register(1);
  controller_->OnDisconnect(2);
  Stopped(0, 0);
  EXPECT_EQ(Detail("attribution")["rule"], "agent-exited");
  // The verdict rests on the backend's sentence (and the loss itself).
  const auto evidence = Detail("attribution")["evidence"];
  bool sentence = false;
  for (const auto& e : evidence) {
    sentence |= e["line"].get<std::string>().find("killed by signal 9 while its host stayed up") != std::string::npos;
  }
  EXPECT_TRUE(sentence) << evidence;
  EXPECT_EQ(Detail("decision")["decision"], "restart");
  EXPECT_EQ(Stored().GetNodeHealth("node1")->status, "");
}

// A scheduler that takes seconds to answer (Slurm: up to 3 s from
// slurmctld and a 1 s connect per lost node) is asked off the controller's
// lock: every node is told to stop at once and the controller answers
// meanwhile; the decision waits for the answer and takes its verdict; the
// node is replaced only once explained.
TEST_F(JobControllerTest, ASlowSchedulerIsAskedOffTheLockAndTheDecisionWaitsForIt) {
  struct SlowScheduler final : NodeProvider {
    void ReplaceNode(const std::string& node_id, const std::string&) override {
      std::lock_guard<std::mutex> lock(mu);
      replaced.push_back(node_id);
    }
    LossExplanation ExplainLoss(const std::string& node_id) override {
      std::unique_lock<std::mutex> lock(mu);
      asked = true;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
      return {"Slurm reports node " + node_id + " DOWN (Not responding)", HostDownVerdict(node_id)};
    }
    std::mutex mu;
    std::condition_variable cv;
    bool asked = false, released = false;
    std::vector<std::string> replaced;
  } slurm;
  off_lock_threads_ = 2;
  Make(2, 1, 3, true);
  controller_->SetNodeProvider(&slurm);
  FakeAgentLink* a = Register(0);
  Register(1);
  controller_->OnDisconnect(2);  // node1 is lost; Slurm is asked and does not answer yet
  {
    std::unique_lock<std::mutex> lock(slurm.mu);
    ASSERT_TRUE(slurm.cv.wait_for(lock, std::chrono::seconds(10), [&] { return slurm.asked; }));
  }
  // While Slurm is being asked: node0 was told to stop, the controller
  // answers, and it decides nothing.
  ASSERT_NE(a->Last(Kind::kStop), nullptr);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  Stopped(0, 0);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  EXPECT_TRUE(EventsOf("decision").empty());
  {
    std::lock_guard<std::mutex> lock(slurm.mu);
    EXPECT_TRUE(slurm.replaced.empty()) << "replaced before the scheduler said why it was lost";
    slurm.released = true;
    slurm.cv.notify_all();
  }
  ASSERT_TRUE(WaitUntil([&] {
    controller_->Tick();
    return controller_->state() != JobState::kStopping;
  }));
  EXPECT_EQ(Detail("attribution")["rule"], "slurm-node-down");
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  std::lock_guard<std::mutex> lock(slurm.mu);
  ASSERT_FALSE(slurm.replaced.empty());  // then again by the eviction (EvictNode's default)
  EXPECT_EQ(slurm.replaced.front(), "node1");
}

// A scheduler that never answers holds the decision up for kExplainWait
// only; the incident is then decided on what else is known.
TEST_F(JobControllerTest, ASchedulerThatNeverAnswersHoldsTheDecisionUpForTenSecondsOnly) {
  struct SilentScheduler final : NodeProvider {
    void ReplaceNode(const std::string&, const std::string&) override {}
    LossExplanation ExplainLoss(const std::string&) override {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
      return {};
    }
    std::mutex mu;
    std::condition_variable cv;
    bool released = false;
  } silent;
  off_lock_threads_ = 1;
  Make(2, 1, 3, true);
  controller_->SetNodeProvider(&silent);
  Register(0);
  Register(1);
  controller_->OnDisconnect(2);
  Stopped(0, 0);
  clock_.Advance(10 * kSecond);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  clock_.Advance(kMillisecond);
  ASSERT_TRUE(WaitUntil([&] {  // the blame runs on a thread of its own
    controller_->Tick();
    return controller_->state() != JobState::kStopping;
  }));
  EXPECT_FALSE(EventsOf("decision").empty());
  {
    std::lock_guard<std::mutex> lock(silent.mu);
    silent.released = true;
    silent.cv.notify_all();
  }
  controller_->SetNodeProvider(nullptr);  // waits for the explainer before `silent` goes
}

TEST_F(JobControllerTest, AHangIsPinnedOnTheRankOutsideTheCollective) {
  Make(1, 3, 3, true);
  FakeAgentLink* a = Register(0);
  Heartbeat(0, 0, {Rank(0, 5), Rank(1, 5), Rank(2, 5)});
  clock_.Advance(config_.hang_timeout + kSecond);
  Heartbeat(0, 0, {Rank(0, 5, 11000), Rank(1, 5, 11000), Rank(2, 5, 11000)});
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  ASSERT_EQ(a->Last(Kind::kStop)->stop().capture_stacks_of_size(), 3);
  v1::AgentMessage m;
  m.mutable_stopped()->set_generation(0);
  for (int r = 0; r < 3; ++r) {
    auto* st = m.mutable_stopped()->add_stacks();
    st->set_global_rank(r);
    st->set_proc_state("S");
    st->set_python(r == 1 ? "  File \"train.py\", line 135 in main\n"
                          : "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", "
                            "line 197 in backward\n  File \"train.py\", line 142 in main\n");
  }
  controller_->OnMessage(1, m);
  auto d = Detail("attribution");
  EXPECT_EQ(d["category"], "comm_hang");
  EXPECT_EQ(d["culprit_ranks"], nlohmann::json::array({1}));
}

// Regression: the culprit's node was whichever node sorted first among those
// named (node0, where the first stuck waiter ran), not the culprit's own.
TEST_F(JobControllerTest, AHangCulpritOnAnotherNodeThanTheFirstStuckRankNamesItsOwnNode) {
  Make(2, 2, 3, true);
  Register(0);
  Register(1);
  Heartbeat(0, 0, {Rank(0, 5), Rank(1, 5)});
  Heartbeat(1, 0, {Rank(2, 5), Rank(3, 5)});
  clock_.Advance(config_.hang_timeout + kSecond);
  Heartbeat(0, 0, {Rank(0, 5, 11000), Rank(1, 5, 11000)});
  Heartbeat(1, 0, {Rank(2, 5, 11000), Rank(3, 5, 11000)});
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  for (int node = 0; node < 2; ++node) {
    v1::AgentMessage m;
    m.mutable_stopped()->set_generation(0);
    for (int r = 2 * node; r < 2 * node + 2; ++r) {
      auto* st = m.mutable_stopped()->add_stacks();
      st->set_global_rank(r);
      st->set_proc_state("S");
      st->set_python(r == 3 ? "  File \"train.py\", line 50 in main\n"
                            : "  File \"/usr/lib/python3/dist-packages/torch/autograd/__init__.py\", "
                              "line 197 in backward\n  File \"train.py\", line 60 in main\n");
    }
    controller_->OnMessage(node + 1, m);
  }
  auto d = Detail("attribution");
  EXPECT_EQ(d["culprit_ranks"], nlohmann::json::array({3}));
  EXPECT_EQ(EventsOf("attribution").at(0).node, "node1");
}

TEST_F(JobControllerTest, AGPUsUncorrectedErrorsThatGrowAreSaidAtOnceAndKeptWithTheNode) {
  Make(1, 1);
  Register(0);
  auto heartbeat = [&](std::int64_t uncorrected) {
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(0);
    *m.mutable_heartbeat()->add_ranks() = Rank(0, 5);
    for (int i = 0; i < 2; ++i) {
      v1::GpuHealth* g = m.mutable_heartbeat()->mutable_metrics()->add_gpus();
      g->set_index(i);
      g->set_ecc_uncorrected(i == 1 ? uncorrected : 0);
      g->set_remapped_rows_pending(0);
      g->set_remapped_rows_failed(0);
    }
    controller_->OnMessage(1, m);
  };
  heartbeat(0);
  heartbeat(0);
  EXPECT_TRUE(EventsOf("gpu_errors").empty());
  heartbeat(2);
  ASSERT_EQ(EventsOf("gpu_errors").size(), 1u);
  EXPECT_EQ(EventsOf("gpu_errors")[0].message, "node node0: GPU 1: uncorrected ECC errors 0 -> 2");
  heartbeat(2);
  EXPECT_EQ(EventsOf("gpu_errors").size(), 1u);  // said once per increase
  controller_->Tick();
  auto actions = store_.NodeActions("node0");
  ASSERT_TRUE(actions.ok());
  ASSERT_EQ(actions->size(), 1u);
  EXPECT_EQ((*actions)[0].action, "gpu-errors");
}

TEST_F(JobControllerTest, ARankThatKeepsComputingThroughALongStepIsNotHung) {
  Make(1, 2);
  Register(0);
  auto active = [&](int rank, std::int64_t age_ms, std::int64_t activity_ms) {
    v1::RankStatus r = Rank(rank, 5, age_ms);
    r.set_activity_sampled(true);
    r.set_activity_age_ms(activity_ms);
    return r;
  };
  Heartbeat(0, 0, {active(0, 0, 0), active(1, 0, 0)});
  clock_.Advance(2 * config_.hang_timeout);
  // Both past the hang timeout without a step; both still use CPU or I/O.
  Heartbeat(0, 0, {active(0, 20000, 500), active(1, 20000, 800)});
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  // Rank 1 goes quiet: it is stalled once quiet for the hang timeout.
  clock_.Advance(config_.hang_timeout - kSecond);
  Heartbeat(0, 0, {active(0, 29000, 300), active(1, 29000, 9000)});
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  clock_.Advance(2 * kSecond);
  controller_->Tick();
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  // Both are in the finding (their stacks are wanted); the quiet one is the culprit.
  auto d = Detail("failure");
  ASSERT_EQ(d["hung_ranks"].size(), 2u) << d.dump();
  EXPECT_EQ(EventsOf("failure").at(0).rank, 1);
}

TEST_F(JobControllerTest, ARankWithoutTheClientIsStalledWhenNothingMovesForTheTimeout) {
  Make(1, 1);
  Register(0);
  v1::RankStatus r = Rank(0, -1, 0);
  r.set_attached(false);
  r.set_activity_sampled(true);
  r.set_activity_age_ms(0);
  Heartbeat(0, 0, {r});
  clock_.Advance(config_.hang_timeout - kSecond);
  r.set_activity_age_ms((config_.hang_timeout - kSecond) / kMillisecond);
  Heartbeat(0, 0, {r});
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  clock_.Advance(2 * kSecond);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kStopping);
}

TEST_F(JobControllerTest, ARestartStormWithoutProgressIsStopped) {
  config_.no_progress_restarts = 2;
  Make(1, 1, 10, true);
  Register(0);
  for (int gen = 0; gen < 3; ++gen) {
    Exit(0, gen, 0, 1, 0, 3, "mysterious exit " + std::to_string(gen));
    Stopped(0, gen);
  }
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_NE(controller_->summary().find("without getting past step"), std::string::npos);
}

// --nnodes MIN:MAX: an evicted node with no spare and no replacement coming
// is not waited for; the job goes on with fewer nodes, renumbered.

}  // namespace
}  // namespace trainguard
