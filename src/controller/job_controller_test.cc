#include "controller/job_controller.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "controller/fake_agent_link.h"

namespace trainguard {
namespace {

using Kind = v1::ControllerMessage::KindCase;

class JobControllerTest : public testing::Test {
 protected:
  void Make(int nnodes = 2, int nproc = 2, int max_restarts = 2, bool attribute = false) {
    config_.job_id = "job";
    config_.nnodes = nnodes;
    config_.nproc_per_node = nproc;
    config_.argv = {"python3", "train.py"};
    config_.max_restarts = max_restarts;
    config_.heartbeat_interval = 1 * kSecond;
    config_.missed_heartbeats = 3;
    config_.hang_timeout = 10 * kSecond;
    config_.startup_timeout = 60 * kSecond;
    config_.stop_timeout = 5 * kSecond;
    config_.rendezvous_timeout = 30 * kSecond;
    if (attribute) {
      auto rules = RuleSet::Load(TG_RULES_FILE);
      ASSERT_TRUE(rules.ok()) << rules.status().ToString();
      rules_ = std::make_unique<RuleSet>(std::move(rules.value()));
      if (!rules_override_.empty()) {
        auto site = RuleSet::Parse(rules_override_, "site rules");
        ASSERT_TRUE(site.ok()) << site.status().ToString();
        rules_->Merge(*site);
      }
    }
    controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_, rules_.get());
    ASSERT_TRUE(controller_->Start().ok());
  }

  // Connects and registers node `i` (conn id i+1).
  FakeAgentLink* Register(int i, std::uint32_t version = kProtocolVersion, const std::string& rack = "") {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(i + 1, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(version);
    m.mutable_register_()->set_node_id("node" + std::to_string(i));
    m.mutable_register_()->set_address("10.0.0." + std::to_string(i));
    m.mutable_register_()->set_free_port(40000 + i);
    m.mutable_register_()->set_runs_diagnostics(true);
    m.mutable_register_()->set_rack(rack);
    controller_->OnMessage(i + 1, m);
    return link.get();
  }

  // Node `i` answers the diagnosis round it was last ordered to run.
  void Diagnosed(int i, FakeAgentLink* link, double gflops) {
    ASSERT_NE(link->Last(Kind::kRunDiagnostics), nullptr) << "node" << i << " was not asked";
    v1::AgentMessage m;
    m.mutable_diagnostics()->set_round(link->Last(Kind::kRunDiagnostics)->run_diagnostics().round());
    m.mutable_diagnostics()->set_figures_json(
        nlohmann::json::array({{{"name", "compute_gflops"}, {"value", gflops}}}).dump());
    m.mutable_diagnostics()->set_wall_ms(2000);
    controller_->OnMessage(i + 1, m);
  }

  // Node `i` answers a collective stage's order with `figures` and a new free port.
  void Collective(int i, FakeAgentLink* link, const nlohmann::json& figures) {
    const v1::ControllerMessage* order = link->Last(Kind::kRunDiagnostics);
    ASSERT_NE(order, nullptr);
    ASSERT_TRUE(order->run_diagnostics().collective()) << "node" << i;
    v1::AgentMessage m;
    m.mutable_diagnostics()->set_round(order->run_diagnostics().round());
    m.mutable_diagnostics()->set_figures_json(figures.dump());
    m.mutable_diagnostics()->set_collective(true);
    m.mutable_diagnostics()->set_free_port(60000 + i);
    controller_->OnMessage(i + 1, m);
  }

  v1::RankStatus Rank(int global, std::int64_t step, std::int64_t age_ms = 0) {
    v1::RankStatus r;
    r.set_global_rank(global);
    r.set_running(true);
    r.set_attached(true);
    r.set_pid(1000 + global);
    r.set_step(step);
    r.set_step_count(step < 0 ? 0 : step);
    r.set_progress_age_ms(age_ms);
    r.set_checkpoint_step(-1);
    return r;
  }

  void Heartbeat(int node, std::int64_t gen, std::vector<v1::RankStatus> ranks) {
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(gen);
    for (auto& r : ranks) *m.mutable_heartbeat()->add_ranks() = r;
    controller_->OnMessage(node + 1, m);
  }

  void Exit(int node, std::int64_t gen, int rank, int code, int sig = 0, std::int64_t step = 7,
            const std::string& last_line = "Traceback: boom", Nanos exit_wall = 0) {
    v1::AgentMessage m;
    auto* e = m.mutable_rank_exited();
    e->set_generation(gen);
    *e->mutable_rank() = Rank(rank, step);
    e->mutable_rank()->set_running(false);
    e->mutable_rank()->set_exit_code(code);
    e->mutable_rank()->set_term_signal(sig);
    e->add_log_tail(last_line);
    e->set_exit_unix_ms((exit_wall > 0 ? exit_wall : clock_.WallNanos()) / kMillisecond);
    controller_->OnMessage(node + 1, m);
  }

  void Stopped(int node, std::int64_t gen) {
    v1::AgentMessage m;
    m.mutable_stopped()->set_generation(gen);
    m.mutable_stopped()->set_free_port(50000 + node);
    controller_->OnMessage(node + 1, m);
  }

  // Node `node` sends the timings of `steps` for its ranks: forward takes
  // `forward_us` (x `slow` on node `slow_node`), backward 2 x that.
  void Timings(int node, std::int64_t gen, int nproc, std::int64_t from, std::int64_t to, double slow = 1.0,
               int slow_node = -1, std::int64_t start_unix_us = 1'700'000'000'000'000) {
    v1::AgentMessage m;
    v1::Timings* t = m.mutable_timings();
    t->set_generation(gen);
    t->add_names("forward");
    t->add_names("backward");
    t->add_names("all_reduce");
    for (std::int64_t step = from; step < to; ++step) {
      for (int local = 0; local < nproc; ++local) {
        v1::StepTiming* st = t->add_steps();
        st->set_global_rank(node * nproc + local);
        st->set_step(step);
        st->set_start_unix_us(start_unix_us + step * 100000);
        st->set_duration_us(100000);
        const bool slowed = node == slow_node || node * nproc + local == slow_rank_;
        std::int64_t fwd = static_cast<std::int64_t>(30000 * (slowed ? slow : 1.0));
        auto* f = st->add_intervals();
        f->set_name(0);
        f->set_kind(1);
        f->set_start_us(0);
        f->set_duration_us(fwd);
        auto* b = st->add_intervals();
        b->set_name(1);
        b->set_kind(1);
        b->set_start_us(fwd);
        b->set_duration_us(2 * fwd);
        auto* c = st->add_intervals();
        c->set_name(2);
        c->set_kind(10);
        c->set_start_us(fwd + 100);
        c->set_duration_us(500);
        c->set_group_id(0);
        c->set_seq(step + 1);
        c->set_peer(-1);
        c->set_numel(1000);
      }
    }
    controller_->OnMessage(node + 1, m);
  }

  // The store once the controller's writes are in it.
  InMemoryEventStore& Stored() {
    if (controller_) {
      EXPECT_TRUE(controller_->FlushStore(std::chrono::milliseconds(10000)));
    }
    return store_;
  }

  std::vector<Event> EventsOf(const std::string& kind) {
    std::vector<Event> out;
    for (const auto& e : Stored().Events("job").value()) {
      if (e.kind == kind) out.push_back(e);
    }
    return out;
  }

  nlohmann::json Detail(const std::string& kind, size_t i = 0) {
    return nlohmann::json::parse(EventsOf(kind).at(i).detail_json);
  }

  JobConfig config_;
  std::string rules_override_;  // a --rules file merged over the shipped rules
  int slow_rank_ = -1;          // Timings: this global rank is slowed as well
  std::unique_ptr<RuleSet> rules_;
  FakeClock clock_;
  InMemoryEventStore store_;
  FakeNodeProvider provider_;
  std::unique_ptr<JobController> controller_;
  std::vector<std::shared_ptr<FakeAgentLink>> links_;
};

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

// Timings go into the store on the controller's clock: a node whose clock is
// 5 s ahead (measured by a clock probe with a 2 ms round trip) has 5 s taken
// off; an offset within the probe's uncertainty is left alone.
TEST_F(JobControllerTest, StepTimingsAreStoredOnTheControllersClock) {
  Make(2, 1);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  controller_->Tick();
  ASSERT_NE(a->Last(Kind::kClockProbe), nullptr);
  std::int64_t t0 = a->Last(Kind::kClockProbe)->clock_probe().controller_unix_us();
  EXPECT_EQ(b->Last(Kind::kClockProbe)->clock_probe().controller_unix_us(), t0);
  clock_.Advance(2 * kMillisecond);
  v1::AgentMessage echo;
  echo.mutable_clock_echo()->set_controller_unix_us(t0);
  echo.mutable_clock_echo()->set_agent_unix_us(t0 + 1000 + 5'000'000);  // node0: 5 s ahead
  controller_->OnMessage(1, echo);
  echo.mutable_clock_echo()->set_agent_unix_us(t0 + 1000 + 300);        // node1: 0.3 ms, within 1 ms
  controller_->OnMessage(2, echo);
  Timings(0, 0, 1, 0, 3, 1.0, -1, 10'000'000);
  Timings(1, 0, 1, 0, 3, 1.0, -1, 10'000'000);
  auto rows = Stored().StepTimings("job", 0, 100).value();
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].rank, 0);
  EXPECT_EQ(rows[0].node, "node0");
  EXPECT_EQ(rows[0].start_us, 10'000'000 - 5'000'000);
  EXPECT_EQ(rows[0].clock_error_us, 1000);
  EXPECT_EQ(rows[1].start_us, 10'000'000);
  EXPECT_EQ(rows[0].totals, "forward=30000;backward=60000;comm:all_reduce=500");
  EXPECT_EQ(rows[0].intervals.substr(0, 18), "forward,1,0,30000;");
}

TEST_F(JobControllerTest, AStragglerIsReportedAndWithEvictTakenOutOfTheJob) {
  config_.straggler_action = "evict";
  Make(4, 2, 3, true);
  std::vector<FakeAgentLink*> links;
  for (int i = 0; i < 4; ++i) links.push_back(Register(i));
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < (p.windows_to_evict + 2) * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 2, step, step + 10, 1.2, 2);
    if (controller_->state() != JobState::kRunning) break;
  }
  auto found = EventsOf("straggler");
  ASSERT_EQ(found.size(), 2u);  // reported, then evictable
  EXPECT_EQ(found[0].node, "node2");
  EXPECT_EQ(Detail("straggler")["signal"], "compute");
  EXPECT_FALSE(Detail("straggler", 0)["evict"].get<bool>());
  EXPECT_TRUE(Detail("straggler", 1)["evict"].get<bool>());
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  for (int node = 0; node < 4; ++node) Stopped(node, 0);
  EXPECT_EQ(Detail("attribution")["rule"], "straggler-compute");
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node2"});
  EXPECT_EQ(Stored().GetNodeHealth("node2")->status, "cordoned");
}

// The eviction is the detector's typed verdict, whatever the job's size (with
// fewer than 3 nodes the detector judges ranks) and whatever a site's rule
// file says of the lines: a rule that claims the straggler's own id, and one
// that matches every line with the highest priority, change nothing.
class StragglerEvictionTest : public JobControllerTest, public testing::WithParamInterface<int> {};

TEST_P(StragglerEvictionTest, TheSlowNodeIsEvictedAndNoRuleFileChangesThat) {
  const int nnodes = GetParam();
  config_.straggler_action = "evict";
  config_.spares = 1;
  rules_override_ = R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
    {"id": "straggler-compute", "category": "user_code", "priority": 100, "role": "cause", "persistence": "persistent",
     "hardware": false, "action": "stop", "pattern": "straggler", "description": "hostile"},
    {"id": "catch-all", "category": "user_code", "priority": 100, "role": "cause", "persistence": "persistent",
     "hardware": false, "action": "stop", "pattern": ".", "description": "hostile"}]})";
  const int nproc = nnodes == 1 ? 4 : 2;  // the detector needs 3 units to compare
  Make(nnodes, nproc, 3, true);
  for (int i = 0; i < nnodes; ++i) Register(i);
  Register(nnodes);  // the spare
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  const int slow_node = nnodes - 1;
  slow_rank_ = slow_node * nproc + 1;  // one rank of the last node computes 60 % slower
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < (p.windows_to_evict + 2) * p.window_steps; step += 10) {
    for (int node = 0; node < nnodes; ++node) Timings(node, 0, nproc, step, step + 10, 1.6, -1);
    if (controller_->state() != JobState::kRunning) break;
  }
  ASSERT_EQ(controller_->state(), JobState::kStopping) << nnodes << " node(s)";
  for (int node = 0; node < nnodes; ++node) Stopped(node, 0);
  const std::string slow = "node" + std::to_string(slow_node);
  EXPECT_EQ(Detail("failure")["failure_kind"], "straggler");
  EXPECT_EQ(Detail("attribution")["rule"], "straggler-compute");
  EXPECT_EQ(Detail("attribution")["category"], "other");
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{slow});
  EXPECT_EQ(Stored().GetNodeHealth(slow)->status, "cordoned");
  EXPECT_EQ(EventsOf("spare_promoted").size(), 1u);
  EXPECT_EQ(controller_->state(), JobState::kRunning);  // restarted with the spare
}

INSTANTIATE_TEST_SUITE_P(Sizes, StragglerEvictionTest, testing::Values(1, 2, 3, 8));

TEST_F(JobControllerTest, AStragglerIsOnlyReportedByDefault) {
  Make(4, 1);
  for (int i = 0; i < 4; ++i) Register(i);
  for (std::int64_t step = 0; step < 200; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 1, step, step + 10, 1.3, 1);
  }
  EXPECT_EQ(EventsOf("straggler").size(), 2u);
  EXPECT_EQ(EventsOf("straggler")[0].node, "node1");
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_TRUE(provider_.evicted.empty());
  // Timings of another generation are stored but judge nobody.
  Timings(3, 7, 1, 500, 600, 5.0, 3);
  EXPECT_EQ(EventsOf("straggler").size(), 2u);
  EXPECT_EQ(Stored().StepTimings("job", 500, 600)->size(), 100u);
}

TEST_F(JobControllerTest, AGpuFaultEvictsTheCulpritNodeAndCordonsIt) {
  Make(2, 2, 3, true);
  Register(0);
  FakeAgentLink* b = Register(1);
  Exit(1, 0, 3, 0, 9, 12, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
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
  Exit(1, 0, 3, 0, 9, 12, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
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
  EXPECT_FALSE(Register(3)->closed);  // its place as a spare is free again
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
  config_.diagnose = "quick";
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
  config_.diagnose = "quick";
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
  config_.diagnose = "quick";
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
  provider_.explanation = "the agent of node node1 was killed by signal 9 while its host stayed up: "
                          "a fault of the agent process, not of the node";
  Make(2, 1, 3, true);
  Register(0);
  Register(1);
  controller_->OnDisconnect(2);
  Stopped(0, 0);
  EXPECT_EQ(Detail("attribution")["rule"], "agent-exited");
  EXPECT_EQ(Detail("decision")["decision"], "restart");
  EXPECT_EQ(Stored().GetNodeHealth("node1")->status, "");
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
  Exit(1, 0, 3, 0, 9, 12, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
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
  Exit(1, 0, 1, 0, 9, 12, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
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
  config_.diagnose = "quick";
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
  config_.diagnose = "quick";
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
  config_.diagnose = "quick";
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
        r->set_last_step_unix_ms(clock_.WallNanos() / kMillisecond);
        r->set_checkpoint_step(10);
      }
      Heartbeat(node, 0, {a, b});
    }
    ASSERT_EQ(EventsOf("first_step").size(), 1u);
    ASSERT_EQ(EventsOf("checkpoint_committed").size(), 1u);
  }
  // The old controller is gone without a word; a new one resumes.
  Status Restart() {
    controller_.reset();
    links_.clear();
    clock_.Advance(3 * kSecond);
    controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_, rules_.get());
    return controller_->Resume();
  }
  // Node `i` reconnects (conn 10 + i) asking to keep its ranks of `generation`.
  FakeAgentLink* Reconnect(int i, std::int64_t generation, std::int64_t step = 14) {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(10 + i, link);
    v1::AgentMessage m;
    v1::Register* r = m.mutable_register_();
    r->set_protocol_version(kProtocolVersion);
    r->set_node_id("node" + std::to_string(i));
    r->set_address("10.0.0." + std::to_string(i));
    r->set_free_port(41000 + i);
    if (generation >= 0) {
      r->set_resume_generation(generation);
      r->set_resume_group_rank(i);
      for (int local : {0, 1}) *r->add_resume_ranks() = Rank(i * 2 + local, step);
    }
    controller_->OnMessage(10 + i, m);
    return link.get();
  }
};

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
