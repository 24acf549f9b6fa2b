#include "agent/timing_collector.h"

#include <gtest/gtest.h>

#include <memory>

namespace trainguard {
namespace {

struct Page {
  Page() : mem(new std::uint8_t[kStatusPageSize]) {
    page = reinterpret_cast<StatusPage*>(mem.get());
    InitStatusPage(page);
  }
  void Phase(const char* name, std::int64_t start, std::int64_t dur, std::int64_t after) {
    TimingAppend(&page->timings, TimingNameIndex(&page->timings, name), TimingKind::kPhase, start, dur,
                 after, 0);
  }
  void Step(std::int64_t step, std::int64_t start, std::int64_t dur, std::int64_t after) {
    TimingAppend(&page->timings, 0, TimingKind::kStep, start, dur, after, step);
  }
  std::unique_ptr<std::uint8_t[]> mem;
  StatusPage* page;
};

TEST(TimingCollectorTest, GroupsPhasesAndOperationsByStepAndHoldsTheNewestBack) {
  Page p;
  int g = JournalAddGroup(&p.page->journal, 0, "default", {0, 1});
  p.Phase("forward", 100, 10, -1);
  std::int64_t t = JournalIssue(&p.page->journal, g, OpKind::kAllReduce, 1, 1000, -1, 112);
  JournalComplete(&p.page->journal, t, 130);
  p.Phase("backward", 110, 25, -1);
  p.Step(0, 90, 50, -1);
  p.Phase("forward", 140, 12, 0);
  TimingCollector c;
  c.Poll(*p.page);
  EXPECT_TRUE(c.Take(false).empty());  // step 0 is held back
  p.Step(1, 140, 40, 0);
  c.Poll(*p.page);
  std::vector<CollectedStep> steps = c.Take(false);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 0);
  EXPECT_EQ(steps[0].start_mono_ns, 90);
  EXPECT_EQ(steps[0].duration_ns, 50);
  ASSERT_EQ(steps[0].intervals.size(), 3u);
  EXPECT_EQ(steps[0].intervals[0].name, "forward");
  EXPECT_EQ(steps[0].intervals[1].name, "backward");
  EXPECT_EQ(steps[0].intervals[2].name, "all_reduce");
  EXPECT_EQ(steps[0].intervals[2].kind, IntervalKind::kCollective);
  EXPECT_EQ(steps[0].intervals[2].duration_ns, 18);
  EXPECT_EQ(steps[0].intervals[2].seq, 1);
  steps = c.Take(true);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 1);
  ASSERT_EQ(steps[0].intervals.size(), 1u);
  EXPECT_EQ(c.dropped(), 0);
}

TEST(TimingCollectorTest, AnOperationIsTakenOnceWhenItCompletesWhateverTheOrder) {
  Page p;
  int g = JournalAddGroup(&p.page->journal, 0, "default", {0, 1});
  std::int64_t a = JournalIssue(&p.page->journal, g, OpKind::kAllReduce, 1, 10, -1, 100);
  std::int64_t b = JournalIssue(&p.page->journal, g, OpKind::kAllReduce, 1, 10, -1, 105);
  JournalComplete(&p.page->journal, b, 110);  // b before a: both must come through
  TimingCollector c;
  c.Poll(*p.page);
  c.Poll(*p.page);
  JournalComplete(&p.page->journal, a, 120);
  c.Poll(*p.page);
  c.Poll(*p.page);
  p.Step(0, 90, 40, -1);
  c.Poll(*p.page);
  std::vector<CollectedStep> steps = c.Take(true);
  ASSERT_EQ(steps.size(), 1u);
  ASSERT_EQ(steps[0].intervals.size(), 2u);
  EXPECT_EQ(steps[0].intervals[0].start_mono_ns, 100);
  EXPECT_EQ(steps[0].intervals[1].start_mono_ns, 105);
}

TEST(TimingCollectorTest, ADeviceTimeReadBackLateJoinsItsStep) {
  Page p;
  p.Phase("forward", 100, 10, -1);
  p.Step(0, 90, 50, -1);
  TimingCollector c;
  c.Poll(*p.page);
  TimingAppend(&p.page->timings, TimingNameIndex(&p.page->timings, "forward"), TimingKind::kGpu, 100, 30, -1, 0);
  p.Step(1, 140, 40, 0);
  c.Poll(*p.page);
  std::vector<CollectedStep> steps = c.Take(true);
  ASSERT_EQ(steps.size(), 2u);
  ASSERT_EQ(steps[0].intervals.size(), 2u);
  EXPECT_EQ(steps[0].intervals[1].kind, IntervalKind::kDevice);
  EXPECT_EQ(steps[0].intervals[1].duration_ns, 30);
  EXPECT_TRUE(steps[1].intervals.empty());
}

TEST(TimingCollectorTest, ACpuTimeStaysWithItsStepAndKind) {
  Page p;
  p.Phase("forward", 100, 10, -1);
  TimingAppend(&p.page->timings, TimingNameIndex(&p.page->timings, "forward"), TimingKind::kCpu, 100, 8, -1, 0);
  p.Step(0, 90, 50, -1);
  TimingCollector c;
  c.Poll(*p.page);
  std::vector<CollectedStep> steps = c.Take(true);
  ASSERT_EQ(steps.size(), 1u);
  ASSERT_EQ(steps[0].intervals.size(), 2u);
  EXPECT_EQ(steps[0].intervals[1].kind, IntervalKind::kCpu);
  EXPECT_EQ(steps[0].intervals[1].duration_ns, 8);
}

TEST(TimingCollectorTest, CountsWhatTheRingLostWhenPolledTooRarely) {
  Page p;
  for (int i = 0; i < kTimingRecords + 10; ++i) p.Phase("x", i, 1, -1);
  TimingCollector c;
  c.Poll(*p.page);
  EXPECT_EQ(c.dropped(), 11);  // the ring keeps kTimingRecords - 1 for a reader that fell behind
}

TEST(TimingCollectorTest, StepsBecomeAMessageWithOneNameTable) {
  CollectedStep a{3, 1000'000, 500'000, {{"forward", IntervalKind::kPhase, 1100'000, 200'000},
                                          {"all_reduce", IntervalKind::kCollective, 1300'000, 50'000, 0, 4, -1, 10}}};
  CollectedStep b{4, 1500'000, 400'000, {{"forward", IntervalKind::kPhase, 1500'000, 100'000}}};
  v1::Timings t;
  std::map<std::string, int> names;
  AddSteps(7, {a}, 2'000'000'000, &t, &names);
  AddSteps(8, {b}, 2'000'000'000, &t, &names);
  ASSERT_EQ(t.names_size(), 2);  // "forward" once
  ASSERT_EQ(t.steps_size(), 2);
  EXPECT_EQ(t.steps(0).global_rank(), 7);
  EXPECT_EQ(t.steps(0).start_unix_us(), 2'001'000);
  EXPECT_EQ(t.steps(0).duration_us(), 500);
  EXPECT_EQ(t.steps(0).intervals(0).start_us(), 100);
  EXPECT_EQ(t.steps(0).intervals(1).kind(), 10);
  EXPECT_EQ(t.steps(0).intervals(1).seq(), 4);
  EXPECT_EQ(t.names(t.steps(1).intervals(0).name()), "forward");
  EXPECT_EQ(t.steps(1).intervals(0).start_us(), 0);
}

}  // namespace
}  // namespace trainguard
