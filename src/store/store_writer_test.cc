#include "store/store_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "store/gated_event_store.h"
#include "testing/wait_until.h"

namespace trainguard {
namespace {

using std::chrono::milliseconds;

Event Ev(const std::string& kind, int i) {
  Event e;
  e.job_id = "job";
  e.kind = kind;
  e.step = i;
  e.message = kind + " " + std::to_string(i);
  e.detail_json = "{}";
  return e;
}

// The job's events in `store` are steps 0..n-1, each once, in order.
void ExpectSteps(EventStore& store, int n) {
  auto events = store.Events("job").value();
  ASSERT_EQ(events.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(events[i].step, i);
}

StoreWriter::Options Fast() {
  StoreWriter::Options o;
  o.retry_min = milliseconds(1);
  o.retry_max = milliseconds(5);
  o.drain_timeout = milliseconds(5000);
  return o;
}

TEST(StoreWriterTest, WritesEverythingInOrder) {
  InMemoryEventStore store;
  StoreWriter w(&store, Fast());
  for (int i = 0; i < 500; ++i) w.Append(Ev("e", i));
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  ExpectSteps(store, 500);
  EXPECT_EQ(w.stats().written, 500);
  EXPECT_EQ(w.stats().queued, 0);
}

// A store that is down (a stopped PostgreSQL): writes wait and are retried
// until it is back; afterwards every write is there once, in order.
TEST(StoreWriterTest, AnOutageLosesNothingAndDuplicatesNothing) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  StoreWriter w(&store, Fast());
  store.SetDown(true);
  for (int i = 0; i < 50; ++i) w.Append(Ev("e", i));
  w.SetNodeHealth({"n1", "cordoned", "evicted", "job", 1});
  // Bounded wait for the writer to have failed a few times.
  testutil::WaitUntil([&] { return w.stats().retries >= 3; }, milliseconds(10000), milliseconds(1));
  EXPECT_GE(w.stats().retries, 3);
  EXPECT_TRUE(w.stats().failing);
  EXPECT_EQ(w.stats().queued, 51);
  EXPECT_TRUE(inner.Events("job").value().empty());
  // Readers see the cordon before the store has it.
  ASSERT_TRUE(w.PendingHealth("n1").has_value());
  EXPECT_EQ(w.PendingHealth("n1")->status, "cordoned");
  store.SetDown(false);
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  auto events = inner.Events("job").value();
  ASSERT_EQ(events.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(events[i].step, i);
  EXPECT_EQ(inner.GetNodeHealth("n1")->status, "cordoned");
  EXPECT_FALSE(w.PendingHealth("n1").has_value());
  EXPECT_FALSE(w.stats().failing);
}

// The store took a write but its answer was lost (a connection dropped at
// COMMIT): the writer tries it again, and the store keeps it once, whether
// it went alone or in a batch.
TEST(StoreWriterTest, AWriteRetriedAfterItsAnswerWasLostIsStoredOnce) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  StoreWriter w(&store, Fast());
  store.LoseAnswers(1);
  w.Append(Ev("e", 0));
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  store.Hold();  // the next ones queue up and go as one batch
  for (int i = 1; i < 20; ++i) w.Append(Ev("e", i));
  store.LoseAnswers(1);
  store.Release();
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  ExpectSteps(inner, 20);
  EXPECT_GE(w.stats().retries, 2);
  EXPECT_EQ(w.stats().written, 20);
}

// When the store comes back, cordons and incidents go before the events
// queued ahead of them; each lane keeps its own order.
TEST(StoreWriterTest, CriticalWritesGoFirstWhenTheStoreComesBack) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  StoreWriter w(&store, Fast());
  store.Hold();
  w.Append(Ev("first", 0));  // taken by the thread, waits in the store
  testutil::WaitUntil([&] { return store.waiting() != 0; }, milliseconds(10000), milliseconds(1));
  ASSERT_EQ(store.waiting(), 1);
  for (int i = 1; i <= 20; ++i) w.Append(Ev("e", i));
  auto cordon = w.SetNodeHealth({"n1", "cordoned", "evicted", "job", 1});
  store.Release();
  ASSERT_TRUE(w.WaitDurable(cordon, milliseconds(10000)));
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  // The cordon was written right after the write in flight, before the 20
  // events (which went together, in one transaction).
  auto written = store.written();
  ASSERT_GE(written.size(), 3u);
  EXPECT_EQ(written[0], "Append");
  EXPECT_EQ(written[1], "SetNodeHealth");
  EXPECT_LT(written.size(), 22u) << "the queued events were not batched";
  auto events = inner.Events("job").value();
  ASSERT_EQ(events.size(), 21u);
  for (int i = 0; i <= 20; ++i) EXPECT_EQ(events[i].step, i);
}

// A full queue makes the caller wait (counted) until the store takes writes;
// nothing is dropped.
TEST(StoreWriterTest, AFullQueueAppliesBackPressure) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  StoreWriter::Options o = Fast();
  o.max_queued = 10;
  o.backpressure_wait = milliseconds(600'000);  // the producer waits for the store here
  StoreWriter w(&store, o);
  store.SetDown(true);
  std::atomic<int> enqueued{0};
  std::thread producer([&] {
    for (int i = 0; i < 30; ++i) {
      w.Append(Ev("e", i));
      ++enqueued;
    }
  });
  testutil::WaitUntil([&] { return w.stats().backpressure_waits != 0; }, milliseconds(10000), milliseconds(1));
  EXPECT_EQ(w.stats().backpressure_waits, 1);
  EXPECT_EQ(enqueued.load(), 10);
  store.SetDown(false);
  producer.join();
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  auto events = inner.Events("job").value();
  ASSERT_EQ(events.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(events[i].step, i);
}

// The caller (the controller, holding its lock) waits on a full queue only so
// long; then the write is queued over the limit, counted, and kept.
TEST(StoreWriterTest, BackPressureWaitsABoundedTimeThenQueuesOverTheLimitLosingNothing) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  StoreWriter::Options o = Fast();
  o.max_queued = 4;
  o.backpressure_wait = milliseconds(20);
  StoreWriter w(&store, o);
  store.SetDown(true);
  for (int i = 0; i < 7; ++i) w.Append(Ev("e", i));  // returns: three waits of 20 ms
  EXPECT_EQ(w.stats().backpressure_waits, 3);
  EXPECT_EQ(w.stats().over_limit, 3);
  EXPECT_EQ(w.stats().queued, 7);
  store.SetDown(false);
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  auto events = inner.Events("job").value();
  ASSERT_EQ(events.size(), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(events[i].step, i);
}

// Step timings are telemetry: a full bulk lane drops a batch (counted), and
// never holds up the events.
TEST(StoreWriterTest, TimingBatchesBeyondTheBulkLaneAreDroppedAndCounted) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  StoreWriter::Options o = Fast();
  o.max_queued_bulk = 3;
  StoreWriter w(&store, o);
  store.SetDown(true);
  StepTimingRecord row;
  row.job_id = "job";
  int taken = 0;
  for (int i = 0; i < 6; ++i) {
    row.step = i;
    taken += w.AppendStepTimings({row}) ? 1 : 0;
  }
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(w.stats().bulk_dropped, 3);
  store.SetDown(false);
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  EXPECT_EQ(inner.StepTimings("job", 0, 100).value().size(), 3u);
}

// A write the store refuses as wrong would never succeed: it is given up
// (counted) and the writes behind it go on.
TEST(StoreWriterTest, AWriteRefusedAsWrongIsGivenUpAndTheRestGoOn) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  store.RefuseEventsOfKind("bad");
  StoreWriter w(&store, Fast());
  w.Append(Ev("good", 0));
  w.Append(Ev("bad", 1));
  w.Append(Ev("good", 2));
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  EXPECT_EQ(inner.Events("job").value().size(), 2u);
  EXPECT_EQ(w.stats().given_up, 1);
  EXPECT_EQ(w.stats().retries, 0);
}

// A batch of queued events that holds a refused one: the batch is refused
// whole (one transaction), then written one by one; the rest are stored once
// each, in order.
TEST(StoreWriterTest, ARefusedEventInABatchLosesNoneOfTheOthers) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  store.RefuseEventsOfKind("bad");
  StoreWriter w(&store, Fast());
  store.Hold();
  w.Append(Ev("good", 0));
  testutil::WaitUntil([&] { return store.waiting() != 0; }, milliseconds(10000), milliseconds(1));
  ASSERT_EQ(store.waiting(), 1);
  for (int i = 1; i <= 6; ++i) w.Append(Ev(i == 3 ? "bad" : "good", i));
  store.Release();
  ASSERT_TRUE(w.Flush(milliseconds(10000)));
  auto events = inner.Events("job").value();
  ASSERT_EQ(events.size(), 6u);
  std::vector<std::int64_t> steps;
  for (const auto& e : events) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(w.stats().given_up, 1);
  EXPECT_EQ(w.stats().written, 6);
}

// The destructor drains what is queued before it returns.
TEST(StoreWriterTest, TheDestructorDrainsTheQueue) {
  InMemoryEventStore inner;
  GatedEventStore store(&inner);
  {
    StoreWriter w(&store, Fast());
    store.Hold();
    for (int i = 0; i < 100; ++i) w.Append(Ev("e", i));
    std::thread release([&] { store.Release(); });
    release.join();
  }
  EXPECT_EQ(inner.Events("job").value().size(), 100u);
}

}  // namespace
}  // namespace trainguard
