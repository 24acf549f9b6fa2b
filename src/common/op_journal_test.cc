#include "common/op_journal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

namespace trainguard {
namespace {

std::unique_ptr<OpJournal> Fresh() {
  auto j = std::make_unique<OpJournal>();
  InitJournal(j.get());
  return j;
}

TEST(OpJournalTest, CollectivesAreNumberedPerGroupAndCompleteInPlace) {
  auto j = Fresh();
  int world = JournalAddGroup(j.get(), 0, "world", {0, 1, 2, 3});
  int dp = JournalAddGroup(j.get(), 3, "dp", {1, 3});
  std::int64_t a = JournalIssue(j.get(), world, OpKind::kAllReduce, DtypeCode("float32"), 100, -1, 10);
  std::int64_t b = JournalIssue(j.get(), dp, OpKind::kBroadcast, DtypeCode("int64"), 5, -1, 20);
  std::int64_t c = JournalIssue(j.get(), world, OpKind::kBarrier, 0, 0, -1, 30);
  JournalComplete(j.get(), a, 15);
  JournalComplete(j.get(), c, 35);
  JournalComplete(j.get(), c, 99);  // twice: the first time stands
  JournalSnapshot s = ReadJournal(*j);
  ASSERT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.groups[0].members, (std::vector<std::int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.groups[0].issued, 2);
  EXPECT_EQ(s.groups[0].completed, 2);
  EXPECT_EQ(s.groups[1].name, "dp");
  EXPECT_EQ(s.groups[1].members, (std::vector<std::int32_t>{1, 3}));
  EXPECT_EQ(s.groups[1].issued, 1);
  EXPECT_EQ(s.groups[1].completed, 0);
  ASSERT_EQ(s.ops.size(), 3u);
  EXPECT_EQ(s.ops[0].kind, OpKind::kAllReduce);
  EXPECT_EQ(s.ops[0].seq, 1);
  EXPECT_EQ(s.ops[0].completed_mono_ns, 15);
  EXPECT_EQ(s.ops[1].group_id, 3);
  EXPECT_EQ(s.ops[1].seq, 1);
  EXPECT_EQ(s.ops[1].completed_mono_ns, 0);  // in flight
  EXPECT_STREQ(DtypeName(s.ops[1].dtype), "int64");
  EXPECT_EQ(s.ops[2].seq, 2);
  EXPECT_EQ(s.ops[2].completed_mono_ns, 35);
}

TEST(OpJournalTest, IrregularGroupsAreListedAndLargeOnesTruncated) {
  auto j = Fresh();
  JournalAddGroup(j.get(), 1, "odd", {0, 2, 7});
  std::vector<std::int32_t> big;
  for (int i = 0; i < 100; ++i) big.push_back(i * i);
  JournalAddGroup(j.get(), 2, "a-name-longer-than-thirty-one-characters", big);
  JournalSnapshot s = ReadJournal(*j);
  EXPECT_EQ(s.groups[0].members, (std::vector<std::int32_t>{0, 2, 7}));
  EXPECT_FALSE(s.groups[0].truncated);
  EXPECT_TRUE(s.groups[1].truncated);
  EXPECT_EQ(s.groups[1].size, 100);
  EXPECT_EQ(s.groups[1].members.size(), static_cast<std::size_t>(kGroupInlineMembers));
  EXPECT_EQ(s.groups[1].name.size(), static_cast<std::size_t>(kGroupNameCapacity - 1));
}

TEST(OpJournalTest, PointToPointIsNumberedPerPeerAndDirection) {
  auto j = Fresh();
  int world = JournalAddGroup(j.get(), 0, "", {0, 1, 2});
  JournalIssue(j.get(), world, OpKind::kSend, 1, 8, 1, 1);
  JournalIssue(j.get(), world, OpKind::kSend, 1, 8, 1, 2);
  JournalIssue(j.get(), world, OpKind::kRecv, 1, 8, 1, 3);
  JournalIssue(j.get(), world, OpKind::kRecv, 1, 8, 2, 4);
  JournalSnapshot s = ReadJournal(*j);
  ASSERT_EQ(s.peers.size(), 2u);
  EXPECT_EQ(s.peers[0].peer, 1);
  EXPECT_EQ(s.peers[0].sends, 2);
  EXPECT_EQ(s.peers[0].recvs, 1);
  EXPECT_EQ(s.peers[1].recvs, 1);
  EXPECT_EQ(s.groups[0].issued, 0);  // point-to-point does not count as the group's collective
  EXPECT_EQ(s.ops[1].seq, 2);
  EXPECT_EQ(s.ops[3].peer, 2);
}

TEST(OpJournalTest, TheRingNeverOverwritesAnOperationInFlight) {
  auto j = Fresh();
  int g = JournalAddGroup(j.get(), 0, "", {0, 1});
  std::int64_t stuck = JournalIssue(j.get(), g, OpKind::kAllReduce, 1, 1, -1, 1);
  for (int i = 0; i < 3 * kJournalRecords; ++i) {
    std::int64_t t = JournalIssue(j.get(), g, OpKind::kAllReduce, 1, 1, -1, 2 + i);
    JournalComplete(j.get(), t, 3 + i);
  }
  JournalSnapshot s = ReadJournal(*j);
  ASSERT_EQ(s.ops.size(), static_cast<std::size_t>(kJournalRecords));
  EXPECT_EQ(s.ops.front().seq, 1);
  EXPECT_EQ(s.ops.front().completed_mono_ns, 0);
  EXPECT_EQ(s.ops.back().seq, 3 * kJournalRecords + 1);
  JournalComplete(j.get(), stuck, 1000);
  EXPECT_EQ(ReadJournal(*j).ops.front().completed_mono_ns, 1000);
}

TEST(OpJournalTest, ADeviceOperationSaysWhenItsDeviceReachedIt) {
  auto j = Fresh();
  int g = JournalAddGroup(j.get(), 0, "world", {0, 1});
  std::int64_t host = JournalIssue(j.get(), g, OpKind::kAllReduce, 1, 8, -1, 1'000'000);
  std::int64_t started = JournalIssue(j.get(), g, OpKind::kAllReduce, 1, 8, -1, 2'000'000, true);
  std::int64_t stuck = JournalIssue(j.get(), g, OpKind::kAllReduce, 1, 8, -1, 3'000'000, true);
  JournalStarted(j.get(), host, 9'000'000);      // a host operation has no device start
  JournalStarted(j.get(), started, 45'000'000);  // 43 ms after it was issued
  JournalStarted(j.get(), started, 99'000'000);  // twice: the first time stands
  JournalComplete(j.get(), started, 50'000'000);
  JournalSnapshot s = ReadJournal(*j);
  ASSERT_EQ(s.ops.size(), 3u);
  EXPECT_FALSE(s.ops[0].on_device);
  EXPECT_EQ(s.ops[0].started_ms, -1);
  EXPECT_TRUE(s.ops[1].on_device);
  EXPECT_EQ(s.ops[1].started_ms, 43);
  EXPECT_TRUE(s.ops[2].on_device);
  EXPECT_EQ(s.ops[2].started_ms, -1);  // issued, never reached by its device
  EXPECT_EQ(s.ops[2].completed_mono_ns, 0);
  // A record reused since: the stale token starts nothing.
  JournalComplete(j.get(), stuck, 3'500'000);
  for (int i = 0; i < kJournalRecords; ++i) {
    JournalComplete(j.get(), JournalIssue(j.get(), g, OpKind::kBarrier, 0, 0, -1, 4'000'000 + i, true), 5'000'000);
  }
  JournalStarted(j.get(), stuck, 6'000'000);
  for (const auto& op : ReadJournal(*j).ops) EXPECT_EQ(op.started_ms, -1) << op.seq;
}

TEST(OpJournalTest, AStaleTokenDoesNotCompleteALaterOperation) {
  auto j = Fresh();
  int g = JournalAddGroup(j.get(), 0, "", {0, 1});
  // Every record in flight: the ring has to reuse one.
  std::vector<std::int64_t> tokens;
  for (int i = 0; i < kJournalRecords + 1; ++i) {
    tokens.push_back(JournalIssue(j.get(), g, OpKind::kAllReduce, 1, 1, -1, 1 + i));
  }
  JournalComplete(j.get(), tokens[0], 500);  // its record now holds operation #129
  JournalSnapshot s = ReadJournal(*j);
  for (const auto& op : s.ops) EXPECT_EQ(op.completed_mono_ns, 0) << op.seq;
}

TEST(OpJournalTest, FullTablesCountDroppedOperations) {
  auto j = Fresh();
  for (int i = 0; i < kJournalGroups; ++i) ASSERT_GE(JournalAddGroup(j.get(), i, "", {0}), 0);
  EXPECT_EQ(JournalAddGroup(j.get(), 99, "", {0}), -1);
  EXPECT_EQ(JournalIssue(j.get(), -1, OpKind::kAllReduce, 1, 1, -1, 1), -1);
  for (int p = 0; p < kJournalPeers; ++p) ASSERT_GE(JournalIssue(j.get(), 0, OpKind::kSend, 1, 1, p, 1), 0);
  EXPECT_EQ(JournalIssue(j.get(), 0, OpKind::kSend, 1, 1, 99, 1), -1);
  EXPECT_EQ(ReadJournal(*j).dropped, 3);
}

TEST(OpJournalTest, AReaderNeverSeesATornRecord) {
  auto j = Fresh();
  int g = JournalAddGroup(j.get(), 7, "", {0, 1});
  std::atomic<bool> reading{false};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    // Start writing only once the reader is reading, or a fast writer can
    // finish before the reader has looked once and the test checks nothing.
    while (!reading.load()) std::this_thread::yield();
    for (int i = 1; i <= 200000; ++i) {
      // numel always equals seq: a torn record would show them apart.
      std::int64_t t = JournalIssue(j.get(), g, OpKind::kAllReduce, 1, i, -1, i);
      JournalComplete(j.get(), t, i + 1);
    }
    done = true;
  });
  int torn = 0;
  int wrong_group = 0;
  int reads_while_writing = 0;
  while (!done.load()) {
    for (const auto& op : ReadJournal(*j).ops) {
      if (op.seq != op.numel) ++torn;
      if (op.group_id != 7) ++wrong_group;
    }
    reading = true;
    ++reads_while_writing;
  }
  writer.join();
  EXPECT_EQ(torn, 0);
  EXPECT_EQ(wrong_group, 0);
  EXPECT_GT(reads_while_writing, 1);
  // The last records are there once the writer is done.
  EXPECT_FALSE(ReadJournal(*j).ops.empty());
}

}  // namespace
}  // namespace trainguard
