// JobController and its store: nothing slow under the controller's lock.
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

}  // namespace
}  // namespace trainguard
