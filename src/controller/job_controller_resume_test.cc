// JobController::Resume: a controller started again on the store of a job
// whose controller died takes it back.
#include <cmath>

#include "controller/job_controller_test_fixture.h"

namespace trainguard {
namespace {

class ResumeTest : public JobControllerTest {
 protected:
  // Generation 0 of 2 nodes x 2 ranks runs, has stepped and checkpointed.
  void RunGeneration0() {
    Make(2, 2, 2, /*attribute=*/true);
    Register(0);
    Register(1);
    for (int node : {0, 1}) {
      v1::AgentMessage m;
      m.mutable_started()->set_generation(0);
      for (int local : {0, 1}) *m.mutable_started()->add_ranks() = Rank(node * 2 + local, -1);
      controller_->OnMessage(node + 1, m);
    }
    for (int node : {0, 1}) {
      v1::RankStatus a = Rank(node * 2, 12), b = Rank(node * 2 + 1, 12);
      for (v1::RankStatus* r : {&a, &b}) {
        r->set_first_step_unix_ms(clock_.WallNanos() / kMillisecond - 5000);
        r->set_first_step(1);
        r->set_last_step_unix_ms(clock_.WallNanos() / kMillisecond);
        r->set_checkpoint_step(10);
      }
      Heartbeat(node, 0, {a, b});
    }
    ASSERT_EQ(EventsOf("first_step").size(), 1u);
    ASSERT_EQ(EventsOf("checkpoint_committed").size(), 1u);
  }
};

// What the SDC monitor learned continues across a controller restart: the
// replica sets are not learned (nor recorded) again, and a divergence right
// after the restart is found without two new steps to learn from.
TEST_F(ResumeTest, TheReplicaSetsLearnedBeforeARestartAreKeptNotLearnedAgain) {
  RunGeneration0();
  auto beat = [&](int node, std::int64_t step, std::uint64_t bad) {
    clock_.Advance(300 * kMillisecond);
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(0);
    for (int local : {0, 1}) {
      v1::RankStatus* r = m.mutable_heartbeat()->add_ranks();
      *r = Rank(node * 2 + local, step);
      v1::Fingerprint* f = r->add_fingerprints();
      f->set_step(step);
      f->set_value(static_cast<std::uint64_t>(step) + (node == 1 && local == 1 ? bad : 0));
    }
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(node), m);
  };
  for (std::int64_t step : {4, 8, 12}) {
    beat(0, step, 0);
    beat(1, step, 0);
  }
  ASSERT_EQ(EventsOf("replica_sets").size(), 1u);
  EXPECT_EQ(Detail("replica_sets")["agreed_through"], 8);  // learned from steps 4 and 8
  ASSERT_TRUE(Restart().ok());
  Reconnect(0, 0, 14);
  Reconnect(1, 0, 14);
  ASSERT_EQ(EventsOf("job_resumed").size(), 1u);
  conn_base_ = 10;
  // Node 1's second rank (3) differs at the first step after the restart.
  beat(0, 16, 0);
  beat(1, 16, 99);
  EXPECT_EQ(EventsOf("replica_sets").size(), 1u) << "learned again";
  auto found = EventsOf("replica_divergence");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].step, 16);
  EXPECT_EQ(found[0].rank, 3);
}

// A straggler named before a controller restart is not named again after it
// (nor recorded twice), and is still evicted once slow long enough.
TEST_F(ResumeTest, AStragglerNamedBeforeARestartIsNotNamedAgain) {
  config_.straggler_action = StragglerAction::kEvict;
  config_.straggler.windows_to_evict = 8;
  Make(4, 1, 1, /*attribute=*/true);
  for (int i = 0; i < 4; ++i) Register(i);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  std::int64_t step = 0;
  for (; EventsOf("straggler").empty() && step < 200; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 1, step, step + 10, 1.3, 2);
  }
  ASSERT_EQ(EventsOf("straggler").size(), 1u);
  EXPECT_EQ(Detail("straggler")["unit"], "node2");
  ASSERT_TRUE(Restart().ok());
  for (int i = 0; i < 4; ++i) Reconnect(i, 0, step);
  ASSERT_EQ(EventsOf("job_resumed").size(), 1u);
  conn_base_ = 10;
  for (; controller_->state() == JobState::kRunning && step < 400; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 1, step, step + 10, 1.3, 2);
  }
  auto named = EventsOf("straggler");
  ASSERT_EQ(named.size(), 2u) << "named again after the restart";
  EXPECT_TRUE(Detail("straggler", 1)["evict"].get<bool>());
  EXPECT_EQ(named[1].node, "node2");
  EXPECT_EQ(controller_->state(), JobState::kStopping);
}

// A controller that died while it diagnosed the nodes after an incident:
// its successor diagnoses them again once they are back, then restarts the
// job once.
TEST_F(ResumeTest, ADiagnosisRoundUnderWayIsRunAgainByTheSuccessorThenTheJobRestartsOnce) {
  config_.diagnose = DiagnoseMode::kQuick;
  Make(2, 1, 3, /*attribute=*/true);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  Diagnosed(0, a, 20);
  Diagnosed(1, b, 20);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  Exit(1, 0, 1, 1);
  Stopped(0, 0);
  Stopped(1, 0);
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing);  // the incident's round: the old controller dies in it
  ASSERT_EQ(EventsOf("diagnosis_started").size(), 2u);
  ASSERT_TRUE(Restart().ok());
  EXPECT_EQ(controller_->state(), JobState::kRestarting);
  conn_base_ = 10;
  FakeAgentLink* a2 = Reconnect(0, -1);
  FakeAgentLink* b2 = Reconnect(1, -1);
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing) << "the round was not run again";
  EXPECT_EQ(Detail("diagnosis_started", 2)["purpose"], "incident 1");
  Diagnosed(0, a2, 20);
  Diagnosed(1, b2, 21);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(EventsOf("restarting").size(), 1u);
  EXPECT_EQ(controller_->restart_count(), 1);
  EXPECT_EQ(EventsOf("diagnosis").size(), 2u);  // the preflight's and the successor's
  EXPECT_EQ(EventsOf("generation_started").size(), 2u);
  for (FakeAgentLink* l : {a2, b2}) {
    ASSERT_NE(l->Last(Kind::kStart), nullptr);
    EXPECT_EQ(l->Last(Kind::kStart)->start().generation(), 1);
  }
}

// The same for a preflight round: the job's first start waits for it again.
TEST_F(ResumeTest, APreflightRoundUnderWayIsRunAgainBeforeTheFirstStart) {
  config_.diagnose = DiagnoseMode::kQuick;
  Make(2, 1);
  Register(0);
  Register(1);
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing);
  ASSERT_TRUE(Restart().ok());
  conn_base_ = 10;
  FakeAgentLink* a = Reconnect(0, -1);
  FakeAgentLink* b = Reconnect(1, -1);
  ASSERT_EQ(controller_->state(), JobState::kDiagnosing);
  EXPECT_EQ(a->Count(Kind::kStart), 0);
  Diagnosed(0, a, 20);
  Diagnosed(1, b, 20);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(EventsOf("diagnosis").size(), 1u);
  EXPECT_EQ(Detail("diagnosis")["purpose"], "preflight");
  ASSERT_NE(b->Last(Kind::kStart), nullptr);
  EXPECT_EQ(b->Last(Kind::kStart)->start().generation(), 0);
}

// The policy's memory is part of the job's status: a deterministic failure
// that a controller restart separates from its repeat is still stopped there.
TEST_F(ResumeTest, ADeterministicFailureStopsAtItsFirstRepeatAcrossAControllerRestart) {
  RunGeneration0();
  const std::string line = "ValueError: Expected input batch_size (4) to match target batch_size (1).";
  auto exit_and_stop = [&](std::uint64_t conn0, std::uint64_t conn1, std::int64_t gen) {
    v1::AgentMessage m;
    auto* e = m.mutable_rank_exited();
    e->set_generation(gen);
    *e->mutable_rank() = Rank(1, 41);
    e->mutable_rank()->set_running(false);
    e->mutable_rank()->set_exit_code(1);
    e->add_log_tail(line);
    e->set_exit_unix_ms(clock_.WallNanos() / kMillisecond);
    controller_->OnMessage(conn0, m);
    for (std::uint64_t conn : {conn0, conn1}) {
      v1::AgentMessage st;
      st.mutable_stopped()->set_generation(gen);
      st.mutable_stopped()->set_free_port(50000 + static_cast<int>(conn));
      controller_->OnMessage(conn, st);
    }
  };
  exit_and_stop(1, 2, 0);
  ASSERT_EQ(controller_->state(), JobState::kRunning);  // restarted once: it may be transient
  EXPECT_EQ(Detail("decision")["decision"], "restart");
  EXPECT_EQ(Detail("decision")["policy"]["signatures"].size(), 1u);
  ASSERT_TRUE(Restart().ok());
  Reconnect(0, 1, 0);
  Reconnect(1, 1, 0);
  ASSERT_EQ(EventsOf("job_resumed").size(), 1u);
  exit_and_stop(10, 11, 1);
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_EQ(controller_->restart_count(), 1);
  EXPECT_NE(controller_->summary().find("deterministic"), std::string::npos) << controller_->summary();
  EXPECT_EQ(Detail("decision", 1)["decision"], "stop");
}

// After a NaN or a divergence the next generations may resume from no
// checkpoint saved after the last good step; a controller restarted in
// between must not forget it, or the next restart loads bad state.
TEST_F(ResumeTest, ARollbacksBoundOutlivesTheController) {
  RunGeneration0();
  for (int node : {0, 1}) {  // every rank's loss is NaN at step 13
    std::vector<v1::RankStatus> ranks;
    for (int local : {0, 1}) {
      v1::RankStatus r = Rank(node * 2 + local, 13);
      r.set_losses_observed(14);
      r.mutable_numeric()->set_step(13);
      r.mutable_numeric()->set_kind(1);
      r.mutable_numeric()->set_value(std::nan(""));
      ranks.push_back(r);
    }
    Heartbeat(node, 0, ranks);
  }
  clock_.Advance(kSecond);
  controller_->Tick();  // a judgement the heartbeats' burst left throttled
  ASSERT_EQ(EventsOf("numeric_anomaly").size(), 1u);
  EXPECT_TRUE(Detail("numeric_anomaly")["all"]);
  Stopped(0, 0);
  Stopped(1, 0);
  auto bound = [](const FakeAgentLink* link) {
    const v1::ControllerMessage* start = link->Last(Kind::kStart);
    if (start == nullptr) return std::string("no start");
    auto it = start->start().env().find("TRAINGUARD_RESUME_AT_MOST");
    return it == start->start().env().end() ? std::string("none") : it->second;
  };
  ASSERT_EQ(bound(links_[0].get()), "12");
  ASSERT_TRUE(Restart().ok());
  FakeAgentLink* a = Reconnect(0, 1, 0);
  FakeAgentLink* b = Reconnect(1, 1, 0);
  v1::AgentMessage crash;
  auto* e = crash.mutable_rank_exited();
  e->set_generation(1);
  *e->mutable_rank() = Rank(1, 5);
  e->mutable_rank()->set_running(false);
  e->mutable_rank()->set_exit_code(1);
  e->set_exit_unix_ms(clock_.WallNanos() / kMillisecond);
  controller_->OnMessage(10, crash);
  for (std::uint64_t conn : {10u, 11u}) {
    v1::AgentMessage st;
    st.mutable_stopped()->set_generation(1);
    st.mutable_stopped()->set_free_port(50000 + static_cast<int>(conn));
    controller_->OnMessage(conn, st);
  }
  EXPECT_EQ(bound(a), "12");  // generation 2: still no checkpoint after step 12
  EXPECT_EQ(bound(b), "12");
}

TEST_F(ResumeTest, TheAgentsOfTheRunningGenerationComeBackWithTheirRanksAndNothingIsRecordedTwice) {
  RunGeneration0();
  ASSERT_TRUE(Restart().ok());
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  ASSERT_EQ(EventsOf("controller_restarted").size(), 1u);
  EXPECT_EQ(Detail("controller_restarted")["previous_state"], "RUNNING");
  FakeAgentLink* a = Reconnect(0, 0);
  ASSERT_NE(a->Last(Kind::kWelcome), nullptr);
  EXPECT_TRUE(a->Last(Kind::kWelcome)->welcome().resumed());
  EXPECT_TRUE(EventsOf("job_resumed").empty());
  FakeAgentLink* b = Reconnect(1, 0);
  EXPECT_TRUE(b->Last(Kind::kWelcome)->welcome().resumed());
  EXPECT_EQ(a->Count(Kind::kStart) + b->Count(Kind::kStart), 0);  // the ranks go on
  ASSERT_EQ(EventsOf("node_reconnected").size(), 2u);
  EXPECT_EQ(Detail("node_reconnected", 1)["pids"]["3"], 1003);
  ASSERT_EQ(EventsOf("job_resumed").size(), 1u);
  EXPECT_EQ(controller_->Snapshot().max_step, 14);
  EXPECT_EQ(controller_->Snapshot().checkpoint_step, 10);
  // Heartbeats after the restart: the same first step and checkpoint are not news.
  for (int node : {0, 1}) {
    v1::RankStatus x = Rank(node * 2, 15), y = Rank(node * 2 + 1, 15);
    for (v1::RankStatus* r : {&x, &y}) {
      r->set_first_step_unix_ms(clock_.WallNanos() / kMillisecond - 8000);
      r->set_first_step(1);
      r->set_checkpoint_step(10);
    }
    controller_->OnMessage(10 + node, [&] {
      v1::AgentMessage m;
      m.mutable_heartbeat()->set_generation(0);
      *m.mutable_heartbeat()->add_ranks() = x;
      *m.mutable_heartbeat()->add_ranks() = y;
      return m;
    }());
  }
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  for (int node : {0, 1}) {
    for (int local : {0, 1}) {
      v1::AgentMessage m;
      auto* e = m.mutable_rank_exited();
      e->set_generation(0);
      *e->mutable_rank() = Rank(node * 2 + local, 20);
      e->mutable_rank()->set_running(false);
      e->mutable_rank()->set_exit_code(0);
      controller_->OnMessage(10 + node, m);
    }
  }
  EXPECT_EQ(controller_->state(), JobState::kSucceeded);
  for (const char* once : {"job_created", "generation_started", "first_step", "checkpoint_committed", "job_succeeded"}) {
    EXPECT_EQ(EventsOf(once).size(), 1u) << once;
  }
  EXPECT_EQ(EventsOf("ranks_started").size(), 2u);
  EXPECT_EQ(controller_->restart_count(), 0);
}

TEST_F(ResumeTest, ARankThatDiedWhileTheControllerWasAwayIsHandledWhenItsAgentIsBack) {
  RunGeneration0();
  ASSERT_TRUE(Restart().ok());
  Reconnect(0, 0);
  Reconnect(1, 0);
  Exit(1, 0, 3, 1, 0, 13, "RuntimeError: CUDA error: an illegal memory access was encountered");
  // (Exit sends on conn node + 1: the old connection; resend on the new one.)
  v1::AgentMessage m;
  auto* e = m.mutable_rank_exited();
  e->set_generation(0);
  *e->mutable_rank() = Rank(3, 13);
  e->mutable_rank()->set_running(false);
  e->mutable_rank()->set_exit_code(1);
  e->add_log_tail("RuntimeError: CUDA error: an illegal memory access was encountered");
  e->set_exit_unix_ms(clock_.WallNanos() / kMillisecond - 2000);  // while the controller was away
  controller_->OnMessage(11, m);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  auto failures = EventsOf("failure");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].rank, 3);
  EXPECT_GT(failures[0].id, EventsOf("controller_restarted")[0].id);
}

// A rank died while no controller led, and its peers died of it. The node
// that comes back first reports only a peer's symptom; the node of the rank
// that died first is still away. The blame waits for it: once back it gets
// the Stop, its exits join the incident, and the first to die is named.
TEST_F(ResumeTest, AnIncidentOpenedBeforeEveryNodeIsBackWaitsForTheRestAndNamesTheFirstToDie) {
  RunGeneration0();
  ASSERT_TRUE(Restart().ok());
  const Nanos died = clock_.WallNanos() - 2 * kSecond;
  conn_base_ = 10;
  Reconnect(0, 0);
  Exit(0, 0, 0, 1, 0, 13, "RuntimeError: [./gloo/transport/tcp/pair.cc:589] Read error [10.0.0.1]:31900: Connection reset by peer",
       died + 300 * kMillisecond);
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  Exit(0, 0, 1, 1, 0, 13, "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.1]:34734",
       died + 320 * kMillisecond);
  Stopped(0, 0);
  controller_->Tick();
  EXPECT_EQ(controller_->state(), JobState::kStopping) << "blamed without node1, away with the rank that died first";
  EXPECT_TRUE(EventsOf("attribution").empty());
  FakeAgentLink* late = Reconnect(1, 0);
  EXPECT_TRUE(late->Last(Kind::kWelcome)->welcome().resumed());
  ASSERT_NE(late->Last(Kind::kStop), nullptr) << "the late node gets the incident's Stop";
  EXPECT_EQ(late->Last(Kind::kStop)->stop().generation(), 0);
  Exit(1, 0, 3, 0, 9, 13, "", died);
  Exit(1, 0, 2, 1, 0, 13, "RuntimeError: [./gloo/transport/tcp/pair.cc:589] Read error [10.0.0.0]:25491: Connection reset by peer",
       died + 310 * kMillisecond);
  Stopped(1, 0);
  ASSERT_EQ(EventsOf("attribution").size(), 1u);
  nlohmann::json a = Detail("attribution");
  EXPECT_EQ(a["culprit_ranks"], nlohmann::json::array({3})) << a.dump();
  EXPECT_EQ(EventsOf("failure").size(), 1u);
  EXPECT_TRUE(EventsOf("job_resumed").empty()) << "the job does not go on: it restarts";
  EXPECT_TRUE(EventsOf("node_lost").empty());
  EXPECT_NE(controller_->state(), JobState::kStopping);
}

// The node still away when the incident opened never comes back: the
// reconnect window ends the wait, as it would have without the incident.
TEST_F(ResumeTest, ANodeStillAwayWhenAnIncidentOpensIsLostAtTheEndOfTheWindowAndTheBlameGoesOn) {
  RunGeneration0();
  ASSERT_TRUE(Restart().ok());
  conn_base_ = 10;
  Reconnect(0, 0);
  Exit(0, 0, 0, 1, 0, 13, "Traceback: boom");
  Stopped(0, 0);
  for (Nanos t = 0; t < config_.reconnect_window - 5 * kSecond; t += 1 * kSecond) {
    clock_.Advance(1 * kSecond);
    Heartbeat(0, 0, {});  // node 0 stays, its ranks stopped
    controller_->Tick();
  }
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  EXPECT_TRUE(EventsOf("attribution").empty());
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(1 * kSecond);
    Heartbeat(0, 0, {});
    controller_->Tick();
  }
  ASSERT_EQ(EventsOf("node_lost").size(), 1u);
  EXPECT_EQ(EventsOf("node_lost")[0].node, "node1");
  EXPECT_EQ(EventsOf("attribution").size(), 1u);
  EXPECT_NE(controller_->state(), JobState::kStopping);
}

// Killed after it recorded a new generation (and so may have told its
// agents to start it) but before its change to RUNNING was stored: the
// generation is taken back as running, not started once more.
TEST_F(ResumeTest, AGenerationRecordedButNotYetMarkedRunningIsTakenBackNotStartedAgain) {
  RunGeneration0();
  controller_.reset();  // the old controller's writes are in the store
  auto append = [&](const std::string& kind, std::int64_t generation, const std::string& detail) {
    Event e;
    e.job_id = "job";
    e.wall_ns = clock_.WallNanos();
    e.kind = kind;
    e.generation = generation;
    e.detail_json = detail;
    ASSERT_TRUE(store_.Append(e).ok());
  };
  append("state", 0, R"({"from": "RUNNING", "to": "STOPPING"})");
  append("state", 0, R"({"from": "STOPPING", "to": "RESTARTING"})");
  append("generation_started", 1, R"({"restart_count": 1, "nnodes": 2, "group_ranks": {"node0": 0, "node1": 1}})");
  ASSERT_TRUE(Restart().ok());
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  Reconnect(0, 1);
  Reconnect(1, 1);
  EXPECT_EQ(EventsOf("node_reconnected").size(), 2u);
  EXPECT_EQ(EventsOf("generation_started").size(), 2u) << "generation 1 was started a second time";
  EXPECT_TRUE(EventsOf("node_lost").empty());
  EXPECT_EQ(controller_->state(), JobState::kRunning);
}

TEST_F(ResumeTest, ANodeThatDoesNotComeBackInTheWindowIsLost) {
  RunGeneration0();
  ASSERT_TRUE(Restart().ok());
  Reconnect(0, 0);
  // Node 0 heartbeats as its agent does; node 1 stays away.
  auto beat = [&] {
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(0);
    *m.mutable_heartbeat()->add_ranks() = Rank(0, 15);
    *m.mutable_heartbeat()->add_ranks() = Rank(1, 15);
    controller_->OnMessage(10, m);
  };
  for (Nanos t = 0; t < config_.reconnect_window - 1 * kSecond; t += 1 * kSecond) {
    clock_.Advance(1 * kSecond);
    beat();
    controller_->Tick();
  }
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_TRUE(EventsOf("node_lost").empty());
  clock_.Advance(1500 * kMillisecond);
  beat();
  controller_->Tick();
  ASSERT_EQ(EventsOf("node_lost").size(), 1u);
  EXPECT_EQ(EventsOf("node_lost")[0].node, "node1");
  EXPECT_NE(EventsOf("node_lost")[0].message.find("did not reconnect within 60 s"), std::string::npos);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
}

// The controller died between recording a generation and sending its
// Starts: every agent comes back without its ranks (one still holds the
// stopped ranks of the generation before). Nothing of it ran, so nothing is
// lost: no incident, no eviction; the same generation is started now.
TEST_F(ResumeTest, AGenerationWhoseStartsNeverWentOutIsStartedNotCountedAsALoss) {
  RunGeneration0();
  Exit(1, 0, 1, 1);
  Stopped(0, 0);
  Stopped(1, 0);
  ASSERT_EQ(controller_->state(), JobState::kRunning);  // generation 1 recorded (and, here, sent)
  ASSERT_EQ(EventsOf("generation_started").size(), 2u);
  ASSERT_TRUE(Restart().ok());  // no RanksStarted of generation 1 had come: as if its Starts never went out
  conn_base_ = 10;
  FakeAgentLink* a = Reconnect(0, 0);   // still holds generation 0's stopped ranks
  FakeAgentLink* b = Reconnect(1, -1);  // holds nothing
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_TRUE(EventsOf("node_lost").empty());
  EXPECT_EQ(EventsOf("failure").size(), 1u);  // the exit's only
  EXPECT_TRUE(EventsOf("node_evicted").empty());
  EXPECT_FALSE(a->Last(Kind::kWelcome)->welcome().resumed());  // it stops what it holds
  for (FakeAgentLink* l : {a, b}) {
    ASSERT_NE(l->Last(Kind::kStart), nullptr);
    EXPECT_EQ(l->Last(Kind::kStart)->start().generation(), 1);
  }
  EXPECT_EQ(controller_->restart_count(), 1);
  EXPECT_EQ(EventsOf("generation_started").size(), 2u) << "recorded once, by the controller that decided it";
  EXPECT_EQ(Detail("job_resumed")["started_again"], true);
}

TEST_F(ResumeTest, ANodeThatComesBackWithoutItsRanksIsLost) {
  // Node 1's agent came back as a new process: its ranks are gone.
  RunGeneration0();
  ASSERT_TRUE(Restart().ok());
  Reconnect(0, 0);
  FakeAgentLink* fresh = Reconnect(1, -1);
  ASSERT_NE(fresh->Last(Kind::kWelcome), nullptr);
  EXPECT_FALSE(fresh->Last(Kind::kWelcome)->welcome().resumed());
  auto lost = EventsOf("node_lost");
  ASSERT_FALSE(lost.empty());
  EXPECT_NE(lost.back().message.find("without the ranks of generation 0"), std::string::npos) << lost.back().message;
  EXPECT_EQ(controller_->state(), JobState::kStopping);
}

TEST_F(ResumeTest, NothingToResumeIsAClearError) {
  Make();
  controller_.reset();
  JobConfig other = config_;
  other.job_id = "never-ran";
  JobController c(other, &clock_, &store_, &provider_);
  Status s = c.Resume();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("never-ran is not in the store"), std::string::npos);
  controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_);
  controller_->SetOffLockThreads(0);
  ASSERT_TRUE(controller_->Resume().ok());  // STARTING: nothing ran
  EXPECT_EQ(controller_->state(), JobState::kStarting);
  controller_->Cancel("enough");
  ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(10)));
  JobController again(config_, &clock_, &store_, &provider_);
  s = again.Resume();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("has ended (FAILED)"), std::string::npos);
}

}  // namespace
}  // namespace trainguard
