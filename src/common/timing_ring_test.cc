#include "common/timing_ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

namespace trainguard {
namespace {

std::unique_ptr<TimingRing> NewRing() {
  auto ring = std::make_unique<TimingRing>();
  std::memset(static_cast<void*>(ring.get()), 0, sizeof(TimingRing));
  return ring;
}

TEST(TimingRingTest, NamesAreInternedAndTruncated) {
  auto ring = NewRing();
  EXPECT_EQ(TimingNameIndex(ring.get(), "forward"), 0);
  EXPECT_EQ(TimingNameIndex(ring.get(), "backward"), 1);
  EXPECT_EQ(TimingNameIndex(ring.get(), "forward"), 0);
  // Longer than 23 bytes: kept as its first 23, and found again by them.
  int a = TimingNameIndex(ring.get(), "a-very-long-phase-name-indeed");
  EXPECT_EQ(a, 2);
  EXPECT_EQ(TimingNameIndex(ring.get(), "a-very-long-phase-name-indeed"), 2);
  EXPECT_STREQ(ring->names[2], "a-very-long-phase-name-");
  // A prefix of a stored name is a name of its own.
  EXPECT_EQ(TimingNameIndex(ring.get(), "forw"), 3);
}

TEST(TimingRingTest, FullNameTableCountsWhatItCannotRecord) {
  auto ring = NewRing();
  for (int i = 0; i < kTimingNames; ++i) {
    ASSERT_EQ(TimingNameIndex(ring.get(), ("p" + std::to_string(i)).c_str()), i);
  }
  int full = TimingNameIndex(ring.get(), "one-too-many");
  EXPECT_EQ(full, -1);
  TimingAppend(ring.get(), full, TimingKind::kPhase, 1, 2, -1, 0);
  EXPECT_EQ(ring->names_full.load(), 1);
  TimingCursor cursor;
  EXPECT_TRUE(cursor.Drain(*ring).empty());
}

TEST(TimingRingTest, DrainReturnsEachRecordOnceInOrder) {
  auto ring = NewRing();
  int fwd = TimingNameIndex(ring.get(), "forward");
  TimingAppend(ring.get(), fwd, TimingKind::kPhase, 100, 10, -1, 0);
  TimingAppend(ring.get(), 0, TimingKind::kStep, 90, 30, -1, 0);
  TimingCursor cursor;
  auto first = cursor.Drain(*ring);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].name, "forward");
  EXPECT_EQ(first[0].kind, TimingKind::kPhase);
  EXPECT_EQ(first[0].start_mono_ns, 100);
  EXPECT_EQ(first[0].duration_ns, 10);
  EXPECT_EQ(first[0].after_step, -1);
  EXPECT_EQ(first[1].kind, TimingKind::kStep);
  EXPECT_EQ(first[1].name, "");
  EXPECT_EQ(first[1].step, 0);
  EXPECT_TRUE(cursor.Drain(*ring).empty());
  TimingAppend(ring.get(), fwd, TimingKind::kGpu, 130, 5, 0, 0);
  auto second = cursor.Drain(*ring);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].kind, TimingKind::kGpu);
  EXPECT_EQ(cursor.dropped(), 0);
}

TEST(TimingRingTest, AReaderThatFallsBehindCountsExactlyWhatWasOverwritten) {
  auto ring = NewRing();
  int p = TimingNameIndex(ring.get(), "p");
  const int total = kTimingRecords + 50;
  for (int i = 0; i < total; ++i) TimingAppend(ring.get(), p, TimingKind::kPhase, i, 1, i, 0);
  TimingCursor cursor;
  auto got = cursor.Drain(*ring);
  // The oldest slot could be mid-rewrite: a reader gets the newest N - 1.
  ASSERT_EQ(got.size(), static_cast<size_t>(kTimingRecords - 1));
  EXPECT_EQ(cursor.dropped(), 51);
  EXPECT_EQ(got.front().start_mono_ns, 51);
  EXPECT_EQ(got.back().start_mono_ns, total - 1);
}

// A writer racing the reader: every record read is one the writer wrote
// (start == after_step == duration, by construction), none is read twice, and
// read + dropped == written.
TEST(TimingRingTest, ConcurrentWriterNeverYieldsATornRecord) {
  auto ring = NewRing();
  int p = TimingNameIndex(ring.get(), "p");
  const std::int64_t total = 200000;
  std::thread writer([&] {
    for (std::int64_t i = 1; i <= total; ++i) TimingAppend(ring.get(), p, TimingKind::kPhase, i, i, i, 0);
  });
  TimingCursor cursor;
  std::int64_t read = 0, last = 0;
  for (;;) {
    bool done = ring->written.load() == static_cast<std::uint64_t>(total);
    for (const TimingSample& t : cursor.Drain(*ring)) {
      ASSERT_EQ(t.start_mono_ns, t.duration_ns);
      ASSERT_EQ(t.start_mono_ns, t.after_step);
      ASSERT_GT(t.start_mono_ns, last);
      last = t.start_mono_ns;
      ++read;
    }
    if (done) break;
  }
  writer.join();
  EXPECT_EQ(read + cursor.dropped(), total);
}

}  // namespace
}  // namespace trainguard
