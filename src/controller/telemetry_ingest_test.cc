// TelemetryIngest: who a connection is, which generation's steps are
// judged, what waits in its inbox, and that nothing of it needs the job.
#include "controller/telemetry_ingest.h"

#include <gtest/gtest.h>

#include "store/event_store.h"

namespace trainguard {
namespace {

class TelemetryIngestTest : public testing::Test {
 protected:
  TelemetryIngestTest() {
    config_.job_id = "job";
    config_.nproc_per_node = 1;
  }

  // `nodes` nodes of one rank each, on conns 1..nodes, generation `gen` running.
  TelemetryIngest& Make(int nodes, std::int64_t gen = 0) {
    ingest_ = std::make_unique<TelemetryIngest>(config_, &clock_, &writer_);
    for (int i = 0; i < nodes; ++i) ingest_->Joined(i + 1, "node" + std::to_string(i));
    ingest_->StartGeneration(gen, nodes);
    return *ingest_;
  }

  // Node `node`'s rank for steps [from, to): forward `fwd_us`, a data wait of `data_us`.
  static v1::Timings Steps(int node, std::int64_t gen, std::int64_t from, std::int64_t to,
                           std::int64_t fwd_us = 30000, std::int64_t data_us = 1000, std::int64_t dropped = 0) {
    v1::Timings t;
    t.set_generation(gen);
    t.set_dropped(dropped);
    t.add_names("forward");
    t.add_names("data");
    for (std::int64_t step = from; step < to; ++step) {
      v1::StepTiming* st = t.add_steps();
      st->set_global_rank(node);
      st->set_step(step);
      st->set_start_unix_us(1'700'000'000'000'000 + step * 100000);
      st->set_duration_us(100000);
      auto* d = st->add_intervals();
      d->set_name(1);
      d->set_kind(1);
      d->set_duration_us(data_us);
      auto* f = st->add_intervals();
      f->set_name(0);
      f->set_kind(1);
      f->set_start_us(data_us);
      f->set_duration_us(fwd_us);
    }
    return t;
  }

  std::size_t StoredRows(std::int64_t from, std::int64_t to) {
    EXPECT_TRUE(writer_.Flush(std::chrono::milliseconds(10000)));
    return store_.StepTimings("job", from, to)->size();
  }

  JobConfig config_;
  FakeClock clock_;
  InMemoryEventStore store_;
  StoreWriter writer_{&store_};
  std::unique_ptr<TelemetryIngest> ingest_;
};

TEST_F(TelemetryIngestTest, OnlyTheConnectionsOfNodesInTheJobAreTakenIn) {
  TelemetryIngest& in = Make(2);
  EXPECT_FALSE(in.OnTimings(9, Steps(0, 0, 0, 5)));  // never joined
  EXPECT_EQ(StoredRows(0, 100), 0u);
  in.OnTimings(1, Steps(0, 0, 0, 5));
  EXPECT_EQ(StoredRows(0, 100), 5u);
  in.Left(1);
  in.OnTimings(1, Steps(0, 0, 5, 10));
  EXPECT_EQ(StoredRows(0, 100), 5u);
  // A clock echo of a connection that left changes no node's clock.
  v1::ClockEcho echo;
  echo.set_controller_unix_us(clock_.WallNanos() / 1000);
  echo.set_agent_unix_us(clock_.WallNanos() / 1000 + 5'000'000);
  in.OnClockEcho(1, echo, 0);
  EXPECT_FALSE(in.ClockOf("node0").known);
  in.OnClockEcho(2, echo, 0);
  EXPECT_TRUE(in.ClockOf("node1").known);
  EXPECT_NEAR(static_cast<double>(in.ClockOf("node1").offset_us), 5'000'000, 1000);
}

TEST_F(TelemetryIngestTest, AStragglerWaitsInTheInboxWithItsGeneration) {
  TelemetryIngest& in = Make(4, 3);
  TelemetryFindings f;
  const StragglerPolicy p;
  auto named = [&] {
    for (const StragglerFinding& x : f.stragglers) {
      if (x.kind == StragglerKind::kStraggler) return &x;
    }
    return static_cast<const StragglerFinding*>(nullptr);
  };
  for (std::int64_t step = 0; step < (p.windows_to_report + 2) * p.window_steps && named() == nullptr; step += 10) {
    bool waiting = false;
    for (int node = 0; node < 4; ++node) {
      waiting = in.OnTimings(node + 1, Steps(node, 3, step, step + 10, node == 2 ? 45000 : 30000)) || waiting;
    }
    f = in.TakeFindings();
    EXPECT_EQ(waiting, !f.empty());
  }
  EXPECT_EQ(f.generation, 3);
  ASSERT_NE(named(), nullptr);
  EXPECT_EQ(named()->node, "node2");
  EXPECT_EQ(named()->signal, StragglerSignal::kCompute);
  EXPECT_TRUE(in.TakeFindings().empty());  // taken once
  EXPECT_EQ(in.Stragglers(), std::set<std::string>{"node2"});
}

TEST_F(TelemetryIngestTest, StepsOfAnotherGenerationOrOfAStoppedOneAreStoredButJudgeNobody) {
  TelemetryIngest& in = Make(4, 1);
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < 4 * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) {
      EXPECT_FALSE(in.OnTimings(node + 1, Steps(node, 0, step, step + 10, node == 2 ? 60000 : 30000, 20000)));
    }
  }
  in.SetRunning(false);
  for (std::int64_t step = 0; step < 4 * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) {
      EXPECT_FALSE(in.OnTimings(node + 1, Steps(node, 1, step, step + 10, node == 2 ? 60000 : 30000, 20000)));
    }
  }
  EXPECT_EQ(StoredRows(0, 1000), static_cast<std::size_t>(2 * 4 * 4 * p.window_steps));
  EXPECT_TRUE(in.Stragglers().empty());
  EXPECT_EQ(in.DataWaitMs(), 0);
}

TEST_F(TelemetryIngestTest, ANewGenerationDropsWhatWasFoundOfTheOldOne) {
  TelemetryIngest& in = Make(4, 0);
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < 2 * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) in.OnTimings(node + 1, Steps(node, 0, step, step + 10, 30000));
  }
  EXPECT_GT(in.DataWaitMs(), 0);
  in.StartGeneration(1, 4);
  EXPECT_TRUE(in.TakeFindings().empty());
  EXPECT_TRUE(in.Stragglers().empty());
  EXPECT_EQ(in.DataWaitMs(), 0);
}

TEST_F(TelemetryIngestTest, LostTimingsAreSaidOncePerCountAndAgainInTheNextGeneration) {
  TelemetryIngest& in = Make(1, 0);
  EXPECT_TRUE(in.OnTimings(1, Steps(0, 0, 0, 1, 30000, 1000, 7)));
  TelemetryFindings f = in.TakeFindings();
  ASSERT_EQ(f.lost.size(), 1u);
  EXPECT_EQ(f.lost[0].node, "node0");
  EXPECT_EQ(f.lost[0].dropped, 7);
  in.OnTimings(1, Steps(0, 0, 1, 2, 30000, 1000, 7));  // the same count: said already
  EXPECT_TRUE(in.TakeFindings().lost.empty());
  // Agents count per generation: 3 lost in the next one are news.
  in.StartGeneration(1, 1);
  in.OnTimings(1, Steps(0, 1, 0, 1, 30000, 1000, 3));
  f = in.TakeFindings();
  ASSERT_EQ(f.lost.size(), 1u);
  EXPECT_EQ(f.lost[0].dropped, 3);
  EXPECT_EQ(f.lost[0].generation, 1);
}

TEST_F(TelemetryIngestTest, TheLayoutIsDueEveryTenStepsWorthUntilRecorded) {
  TelemetryIngest& in = Make(2, 0);
  // One rank's first row: the other has not reported its groups (a try
  // would read every rank of the job for nothing).
  EXPECT_FALSE(in.OnTimings(1, Steps(0, 0, 0, 1)));
  EXPECT_FALSE(in.TakeFindings().layout_due);
  ASSERT_TRUE(in.OnTimings(2, Steps(1, 0, 0, 1)));  // a step's worth: a first try
  EXPECT_EQ(in.TakeFindings().layout_due, std::optional<bool>(false));
  in.OnTimings(2, Steps(1, 0, 1, 19));  // 20 rows of 2 ranks: not 10 steps' worth since
  EXPECT_FALSE(in.TakeFindings().layout_due);
  in.OnTimings(2, Steps(1, 0, 19, 21));
  EXPECT_EQ(in.TakeFindings().layout_due, std::optional<bool>(false));
  in.OnTimings(1, Steps(0, 0, 1, 200));  // past 100 steps' worth: as it is
  EXPECT_EQ(in.TakeFindings().layout_due, std::optional<bool>(true));
  in.LayoutRecorded(0);
  in.OnTimings(1, Steps(0, 0, 200, 300));
  EXPECT_FALSE(in.TakeFindings().layout_due);
}

TEST_F(TelemetryIngestTest, AResumedGenerationDoesNotNameItsReportedStragglersAgain) {
  ingest_ = std::make_unique<TelemetryIngest>(config_, &clock_, &writer_);
  for (int i = 0; i < 4; ++i) ingest_->Joined(i + 1, "node" + std::to_string(i));
  ingest_->Resume(2, 4, {{"node2", StragglerSignal::kCompute, 0, false}}, 2);
  EXPECT_EQ(ingest_->Stragglers(), std::set<std::string>{"node2"});
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < (p.windows_to_report + 1) * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) {
      ingest_->OnTimings(node + 1, Steps(node, 2, step, step + 10, node == 2 ? 45000 : 30000));
    }
  }
  TelemetryFindings f = ingest_->TakeFindings();
  for (const auto& s : f.stragglers) EXPECT_TRUE(s.kind != StragglerKind::kStraggler || s.evict) << s.message;
  EXPECT_FALSE(f.layout_due);  // recorded before the restart
}

}  // namespace
}  // namespace trainguard
