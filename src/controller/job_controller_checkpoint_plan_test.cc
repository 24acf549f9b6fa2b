// The checkpoint plan (docs/checkpoint_policy.md): CheckpointPolicy's logic,
// and the controller sending and recording it.
#include "controller/checkpoint_policy.h"
#include "controller/job_controller_test_fixture.h"

namespace trainguard {
namespace {

TEST(CheckpointPolicyTest, ASavesCostIsMeasuredAcrossGenerationsAndTheRatePerGpuHour) {
  JobConfig c;
  c.nnodes = 2;
  c.nproc_per_node = 4;
  CheckpointPolicy p(c);
  EXPECT_DOUBLE_EQ(p.SaveCost(), c.checkpoint_cost_prior_s);  // nothing measured: the prior
  p.ObserveSaves(0, 2, 1'000'000);
  p.ObserveSaves(0, 4, 2'000'000);
  EXPECT_DOUBLE_EQ(p.SaveCost(), 0.5);
  p.ObserveSaves(1, 1, 2'000'000);  // a new process counts from zero
  EXPECT_DOUBLE_EQ(p.SaveCost(), 4.0 / 5);
  p.ObserveSaves(0, 9, 9'000'000);  // a late report of the old generation
  p.ObserveSaves(1, 1, 2'000'000);  // the same report again
  EXPECT_EQ(p.saves(), 5);
  EXPECT_DOUBLE_EQ(p.SaveCost(), 4.0 / 5);

  p.Begin(0);
  const CheckpointPlan before = p.Current(100 * 3600 * kSecond);
  // No failure in 800 GPU-hours: the prior's 3 failures over its exposure and these hours.
  EXPECT_NEAR(before.job_mtbf_s, 3600 * (3 / c.failure_prior_per_gpu_hour + 800) / 3 / 8, 1);
  for (int i = 0; i < 40; ++i) p.ObserveIncident(i == 0);
  // 40 failures in 800 GPU-hours: far above the prior, and the plan follows.
  const CheckpointPlan after = p.Current(100 * 3600 * kSecond);
  EXPECT_LT(after.job_mtbf_s, before.job_mtbf_s / 10);
  EXPECT_LT(after.memory_interval_s, before.memory_interval_s / 3);
}

// Two nodes of `nproc` ranks running, the first plan sent to both.
class CheckpointPlanTest : public JobControllerTest {
 protected:
  void StartTwo(int nproc) {
    Make(2, nproc);
    a_ = Register(0);
    b_ = Register(1);
    controller_->Tick();
    ASSERT_EQ(a_->Count(Kind::kCheckpointPlan), 1);
    ASSERT_EQ(b_->Count(Kind::kCheckpointPlan), 1);
  }
  FakeAgentLink* a_ = nullptr;
  FakeAgentLink* b_ = nullptr;
};

TEST_F(CheckpointPlanTest, TheCheckpointPlanIsSentOnceAndAgainWhenTheSavesCostMoreThanAssumed) {
  StartTwo(2);
  FakeAgentLink* a = a_;
  FakeAgentLink* b = b_;
  const v1::CheckpointPlan first = a->Last(Kind::kCheckpointPlan)->checkpoint_plan();
  // Four GPUs at the prior rate: a failure every ~7,400 hours; a save assumed to block 0.159 s.
  EXPECT_NEAR(first.job_mtbf_s() / 3600, 1 / (config_.failure_prior_per_gpu_hour * 4), 1);
  EXPECT_NEAR(first.memory_interval_ms() / 1000.0, OptimalCheckpointInterval(0.159, first.job_mtbf_s()), 1);
  ASSERT_EQ(EventsOf("checkpoint_plan").size(), 1u);
  EXPECT_EQ(Detail("checkpoint_plan")["save_cost_s"], 0.159);

  // Rank 0's first saves block 2 s each: the interval grows by √(2 / 0.159),
  // sent at once (the plan rested on the assumed cost).
  v1::RankStatus r = Rank(0, 50);
  r.set_checkpoint_saves(5);
  r.set_checkpoint_blocked_us(10'000'000);
  Heartbeat(0, 0, {r, Rank(1, 50)});
  controller_->Tick();
  ASSERT_EQ(b->Count(Kind::kCheckpointPlan), 2);
  const v1::CheckpointPlan second = b->Last(Kind::kCheckpointPlan)->checkpoint_plan();
  EXPECT_NEAR(static_cast<double>(second.memory_interval_ms()) / static_cast<double>(first.memory_interval_ms()),
              std::sqrt(2 / 0.159), 0.05);
  EXPECT_EQ(EventsOf("checkpoint_plan").size(), 2u);
  // Saves that cost 8 s from then on: sent at the next minute's look, not before.
  r.set_checkpoint_saves(10);
  r.set_checkpoint_blocked_us(50'000'000);
  Heartbeat(0, 0, {r, Rank(1, 60)});
  controller_->Tick();
  EXPECT_EQ(a->Count(Kind::kCheckpointPlan), 2);
  clock_.Advance(61 * kSecond);
  Heartbeat(1, 0, {Rank(2, 60), Rank(3, 60)});
  Heartbeat(0, 0, {r, Rank(1, 60)});
  controller_->Tick();
  EXPECT_EQ(a->Count(Kind::kCheckpointPlan), 3);
  // A few more saves of the same cost change nothing worth sending.
  r.set_checkpoint_saves(11);
  r.set_checkpoint_blocked_us(55'000'000);
  Heartbeat(0, 0, {r, Rank(1, 70)});
  clock_.Advance(61 * kSecond);
  controller_->Tick();
  EXPECT_EQ(a->Count(Kind::kCheckpointPlan), 3);
}

TEST_F(CheckpointPlanTest, ANewGenerationsNodesGetThePlanAndAResumedControllerDoesNotRecordItAgain) {
  StartTwo(1);
  FakeAgentLink* a = a_;
  FakeAgentLink* b = b_;
  // Rank 1 fails; the restart's nodes are told the plan in force, which is not recorded again.
  Exit(1, 0, 1, 1);
  Stopped(0, 0);
  Stopped(1, 0);
  controller_->Tick();
  ASSERT_EQ(controller_->restart_count(), 1);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  controller_->Tick();
  EXPECT_EQ(a->Count(Kind::kCheckpointPlan), 2);
  EXPECT_EQ(b->Count(Kind::kCheckpointPlan), 2);
  EXPECT_EQ(EventsOf("checkpoint_plan").size(), 1u);
  // A controller that takes over: its agents get the plan, and the store holds it once.
  ASSERT_TRUE(Restart().ok());
  conn_base_ = 10;
  FakeAgentLink* a2 = Reconnect(0, 1);
  FakeAgentLink* b2 = Reconnect(1, 1);
  controller_->Tick();
  EXPECT_EQ(a2->Count(Kind::kCheckpointPlan), 1);
  EXPECT_EQ(b2->Count(Kind::kCheckpointPlan), 1);
  EXPECT_EQ(EventsOf("checkpoint_plan").size(), 1u);
}

// The jobs that ended in the store: 2 nodes x 8 GPUs for 10 hours and 1 x 4
// for 5, with 4 incidents between them: 4 failures in 180 GPU-hours.
void FleetHistory(InMemoryEventStore* store, FakeClock* clock) {
  const Nanos start = clock->WallNanos() - 20 * 3600 * kSecond;
  for (const auto& [id, nodes, gpus, hours] : {std::tuple{"old-a", 2, 8, 10}, std::tuple{"old-b", 1, 4, 5}}) {
    JobRecord j{id, start, "python3 train.py",
                "{\"nnodes\": " + std::to_string(nodes) + ", \"nproc_per_node\": " + std::to_string(gpus) + "}",
                "RUNNING", ""};
    ASSERT_TRUE(store->CreateJob(j).ok());
    ASSERT_TRUE(store->UpdateJob(id, "SUCCEEDED", "", start + hours * 3600 * kSecond).ok());
  }
  for (const char* job : {"old-a", "old-a", "old-a", "old-b"}) {
    IncidentRecord i;
    i.job_id = job;
    ASSERT_TRUE(store->RecordIncident(i).ok());
  }
}

TEST_F(CheckpointPlanTest, AJobStartsFromTheFleetsFailureRateAndAResumedControllerKeepsIt) {
  FleetHistory(&store_, &clock_);
  StartTwo(2);
  const v1::CheckpointPlan first = a_->Last(Kind::kCheckpointPlan)->checkpoint_plan();
  // 4 failures per 180 GPU-hours on 4 GPUs: a failure every 11.25 hours.
  EXPECT_NEAR(first.job_mtbf_s() / 3600, 180.0 / 4 / 4, 0.01);
  nlohmann::json created = Detail("job_created");
  EXPECT_EQ(created["failure_prior_from"], "4 failure(s) in 180 GPU-hours of 2 job(s) in this store");
  EXPECT_NEAR(created["knobs"]["failure_prior"].get<double>(), 4000.0 / 180, 1e-6);
  const std::string said = EventsOf("checkpoint_plan")[0].message;
  EXPECT_NE(said.find("from 4 failure(s) in 180 GPU-hours"), std::string::npos) << said;
  // A controller that takes over plans from the same prior: no new plan to record.
  ASSERT_TRUE(Restart().ok());
  conn_base_ = 10;
  Reconnect(0, 0);
  Reconnect(1, 0);
  controller_->Tick();
  clock_.Advance(61 * kSecond);
  controller_->Tick();
  EXPECT_EQ(EventsOf("checkpoint_plan").size(), 1u);
}

TEST_F(CheckpointPlanTest, AGivenPriorOrTooFewFailuresLeaveTheFleetsRateAside) {
  FleetHistory(&store_, &clock_);
  config_.failure_prior_given = true;  // --failure-prior, here the default's value
  StartTwo(2);
  EXPECT_NEAR(a_->Last(Kind::kCheckpointPlan)->checkpoint_plan().job_mtbf_s() / 3600,
              1 / (config_.failure_prior_per_gpu_hour * 4), 1);
  EXPECT_FALSE(Detail("job_created").contains("failure_prior_from"));
}

}  // namespace
}  // namespace trainguard
