// JobController and its store: nothing slow under the controller's lock.
#include <future>
#include <map>
#include <mutex>

#include "controller/job_controller_test_fixture.h"
#include "store/gated_event_store.h"

namespace trainguard {
namespace {

// While every write waits (a stalled PostgreSQL, a SQLite file another
// process holds locked), registrations, heartbeats and an exit are handled
// as usual: the job starts, runs 20 s without losing a node, detects the
// crash, stops and restarts. Once the store takes writes again, every event
// is there once, in the order it was made.
TEST_F(JobControllerTest, AHeldStoreHoldsUpNoRegistrationHeartbeatOrExit) {
  GatedEventStore gated(&store_);
  write_store_ = &gated;
  Make(2, 2, 3);
  ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(10)));  // job_created
  gated.Hold();
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  ASSERT_NE(a->Last(Kind::kStart), nullptr);
  for (int s = 0; s < 20; ++s) {
    clock_.Advance(1 * kSecond);
    Heartbeat(0, 0, {Rank(0, s), Rank(1, s)});
    Heartbeat(1, 0, {Rank(2, s), Rank(3, s)});
    controller_->Tick();
  }
  EXPECT_EQ(controller_->state(), JobState::kRunning);  // 20 s, heartbeats every second: nobody lost
  Exit(1, 0, 3, 1);
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  Stopped(0, 0);
  Stopped(1, 0);
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  ASSERT_NE(b->Last(Kind::kStart), nullptr);
  EXPECT_EQ(b->Last(Kind::kStart)->start().generation(), 1);
  // Nothing of it is in the store yet: it all waits in the writer's queue.
  EXPECT_EQ(store_.Events("job").value().size(), 1u);
  EXPECT_GT(controller_->StoreStats().queued, 10);
  gated.Release();
  ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(10)));
  std::vector<std::string> kinds;
  for (const auto& e : store_.Events("job").value()) kinds.push_back(e.kind);
  auto count = [&](const std::string& k) { return std::count(kinds.begin(), kinds.end(), k); };
  EXPECT_EQ(count("node_lost"), 0);
  EXPECT_EQ(count("failure"), 1);
  EXPECT_EQ(count("decision"), 1);
  EXPECT_EQ(count("generation_started"), 2);
  EXPECT_EQ(count("node_registered"), 2);
  auto at = [&](const std::string& k) { return std::find(kinds.begin(), kinds.end(), k) - kinds.begin(); };
  EXPECT_LT(at("node_registered"), at("generation_started"));
  EXPECT_LT(at("generation_started"), at("failure"));
  EXPECT_LT(at("failure"), at("decision"));
  EXPECT_LT(at("decision"), at("restarting"));
  controller_.reset();  // before `gated` goes
}

// A link a thread other than the test's sends on: it counts what it got and
// whether the store had the generation's record when its Start came.
class RecordCheckingLink final : public AgentLink {
 public:
  explicit RecordCheckingLink(InMemoryEventStore* store) : store_(store) {}
  void Send(const v1::ControllerMessage& msg) override {
    bool recorded = false;
    if (msg.has_start()) {
      for (const auto& e : store_->Events("job").value()) {
        recorded = recorded || (e.kind == "generation_started" && e.generation == msg.start().generation());
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++count_[msg.kind_case()];
    if (msg.has_start()) start_was_recorded_ = recorded;
  }
  void Close() override {}
  Nanos LastHeardMono() const override { return 0; }
  int Count(Kind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    return count_[kind];
  }
  bool start_was_recorded() {
    std::lock_guard<std::mutex> lock(mu_);
    return start_was_recorded_;
  }

 private:
  InMemoryEventStore* const store_;
  std::mutex mu_;
  std::map<Kind, int> count_;
  bool start_was_recorded_ = false;
};

class StartRecordTest : public JobControllerTest {
 protected:
  // Two nodes of one rank, the controller's work off its lock, every write
  // through `gated_`; the job's first record is in.
  void SetUp() override {
    write_store_ = &gated_;
    off_lock_threads_ = 1;
    config_.start_record_wait = 60 * kSecond;  // the record always comes first here
    Make(2, 1);
    ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(10)));
  }
  void TearDown() override {
    gated_.Release();
    controller_.reset();  // before `gated_` goes
  }
  std::shared_ptr<RecordCheckingLink> Join(int i) {
    auto link = std::make_shared<RecordCheckingLink>(&store_);
    controller_->OnConnect(i + 1, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(kProtocolVersion);
    m.mutable_register_()->set_node_id("node" + std::to_string(i));
    m.mutable_register_()->set_address("10.0.0." + std::to_string(i));
    m.mutable_register_()->set_free_port(40000 + i);
    controller_->OnMessage(i + 1, m);
    return link;
  }

  GatedEventStore gated_{&store_};
};

// A new generation's Start waits for its record in the store, and that wait
// holds nothing up: the registration that completed the job returns, ticks
// and reads go on, while a stalled store holds the record back.
TEST_F(StartRecordTest, AStartWaitsForItsRecordWithoutHoldingTheControllerUp) {
  auto a = Join(0);
  gated_.Hold();
  auto joined = std::async(std::launch::async, [&] { return Join(1); });
  ASSERT_EQ(joined.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the registration waited for the store under the controller's lock";
  auto b = joined.get();
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  clock_.Advance(3 * kSecond);
  controller_->Tick();  // probes clocks: the lock is free
  EXPECT_EQ(a->Count(Kind::kClockProbe), 1);
  EXPECT_EQ(a->Count(Kind::kStart), 0);  // not before its record is in
  gated_.Release();
  ASSERT_TRUE(WaitUntil([&] { return a->Count(Kind::kStart) == 1 && b->Count(Kind::kStart) == 1; }));
  EXPECT_TRUE(a->start_was_recorded());
  EXPECT_TRUE(b->start_was_recorded());
}

// A generation stopped while its record was still on its way never starts:
// its nodes got the Stop, and no Start after it.
TEST_F(StartRecordTest, AGenerationStoppedBeforeItsRecordWasInIsNeverStarted) {
  auto a = Join(0);
  gated_.Hold();
  auto b = Join(1);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  controller_->OnDisconnect(1);  // node0's agent goes away at once
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  EXPECT_EQ(b->Count(Kind::kStop), 1);
  gated_.Release();
  ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(10)));
  // The sender has had its turn once the record is in and the lock was free.
  ASSERT_TRUE(WaitUntil([&] {
    for (const auto& e : store_.Events("job").value()) {
      if (e.kind == "failure") return true;
    }
    return false;
  }));
  controller_.reset();  // waits for the sender
  EXPECT_EQ(a->Count(Kind::kStart), 0);
  EXPECT_EQ(b->Count(Kind::kStart), 0);
}

}  // namespace
}  // namespace trainguard
