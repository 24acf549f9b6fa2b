// The detectors on hand-made views: no controller, sockets or processes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "controller/crash_detector.h"
#include "controller/hang_detector.h"
#include "controller/heartbeat_detector.h"

namespace trainguard {
namespace {

constexpr Nanos kNowMono = 1000 * kSecond;
constexpr Nanos kNowWall = 1'700'000'000 * kSecond;

JobConfig Config() {
  JobConfig c;
  c.heartbeat_interval = 1 * kSecond;
  c.missed_heartbeats = 3;
  c.hang_timeout = 10 * kSecond;
  c.startup_timeout = 60 * kSecond;
  return c;
}

// A running, attached rank that made `steps` steps, the last `progress_s`
// seconds ago, and last used CPU or I/O `activity_s` seconds ago.
RankView Rank(int global, std::int64_t steps, double progress_s, double activity_s,
              const std::string& state = "S") {
  RankView v;
  v.status.set_global_rank(global);
  v.status.set_running(true);
  v.status.set_attached(true);
  v.status.set_step(steps);
  v.status.set_step_count(steps);
  v.status.set_progress_age_ms(static_cast<std::int64_t>(progress_s * 1000));
  v.status.set_activity_sampled(true);
  v.status.set_activity_age_ms(static_cast<std::int64_t>(activity_s * 1000));
  v.status.set_proc_state(state);
  v.received_mono = kNowMono;
  return v;
}

struct Job {
  std::vector<NodeView> nodes;
  JobView View() const {
    JobView v;
    v.now_mono = kNowMono;
    v.now_wall = kNowWall;
    for (const auto& n : nodes) v.nodes.push_back(&n);
    return v;
  }
  void Put(int node, RankView r) {
    while (static_cast<int>(nodes.size()) <= node) {
      NodeView n;
      n.node_id = "node" + std::to_string(nodes.size());
      n.group_rank = static_cast<int>(nodes.size());
      n.last_heartbeat_mono = kNowMono;
      n.last_heartbeat_wall = kNowWall;
      nodes.push_back(n);
    }
    nodes[node].ranks[r.status.global_rank()] = r;
  }
};

TEST(CrashDetectorTest, ExitZeroIsNoFinding) {
  v1::RankExited e;
  e.mutable_rank()->set_global_rank(1);
  EXPECT_FALSE(DetectCrash("node0", e, kNowWall).has_value());
}

TEST(CrashDetectorTest, NonZeroExitNamesRankStepTimeAndKernelLinesFirst) {
  v1::RankExited e;
  e.mutable_rank()->set_global_rank(3);
  e.mutable_rank()->set_step(42);
  e.mutable_rank()->set_exit_code(7);
  e.set_exit_unix_ms(kNowWall / kMillisecond - 2500);
  e.add_log_tail("Traceback (most recent call last):");
  e.add_log_tail("RuntimeError: boom");
  e.add_kernel_lines("NVRM: Xid 79");
  auto f = DetectCrash("node1", e, kNowWall);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, FindingKind::kRankFailed);
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->node, "node1");
  EXPECT_EQ(f->rank_step, 42);
  EXPECT_EQ(f->fault_wall, kNowWall - 2500 * kMillisecond);
  EXPECT_NE(f->description.find("exited with code 7 at step 42"), std::string::npos);
  EXPECT_NE(f->description.find("last output: RuntimeError: boom"), std::string::npos);
  ASSERT_EQ(f->lines.size(), 4u);
  EXPECT_EQ(f->lines[0].text, "NVRM: Xid 79");
  EXPECT_EQ(f->lines[0].rank, -1);
  EXPECT_EQ(f->lines[2].rank, 3);
  EXPECT_EQ(nlohmann::json::parse(f->detail_json)["exit_code"], 7);
}

TEST(CrashDetectorTest, SignalWithoutExitTimeIsDatedNow) {
  v1::RankExited e;
  e.mutable_rank()->set_global_rank(0);
  e.mutable_rank()->set_step(-1);
  e.mutable_rank()->set_term_signal(9);
  auto f = DetectCrash("node0", e, kNowWall);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->fault_wall, kNowWall);
  EXPECT_NE(f->description.find("killed by signal 9 before any step"), std::string::npos);
}

TEST(HeartbeatDetectorTest, SilentPastTheLimitIsLostAtItsLastHeartbeat) {
  Job job;
  job.Put(0, Rank(0, 5, 0, 0));
  job.Put(1, Rank(1, 5, 0, 0));
  job.nodes[0].last_heartbeat_mono = kNowMono - 3 * kSecond;  // exactly the limit: not yet
  job.nodes[1].last_heartbeat_mono = kNowMono - 3 * kSecond - 1;
  job.nodes[1].last_heartbeat_wall = kNowWall - 4 * kSecond;
  auto found = DetectSilentNodes(job.View(), Config());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].node, "node1");
  EXPECT_EQ(found[0].kind, FindingKind::kNodeLost);
  EXPECT_EQ(found[0].fault_wall, kNowWall - 4 * kSecond);
  EXPECT_NE(found[0].description.find("no heartbeat for 3.000 s"), std::string::npos);
}

TEST(HangDetectorTest, ProgressingRanksAreNotHung) {
  Job job;
  for (int r = 0; r < 4; ++r) job.Put(r / 2, Rank(r, 10, 1, 0));
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
}

TEST(HangDetectorTest, AHangOfThousandsOfRanksDescribesABoundedNumber) {
  Job job;
  for (int r = 0; r < 1000; ++r) job.Put(r / 8, Rank(r, 10, 12, r == 517 ? 11 : 0.2));
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 517);
  EXPECT_EQ(f->hung_ranks.size(), 1000u);
  ASSERT_EQ(f->capture_stacks_of.size(), kHungRanksDescribed);
  EXPECT_EQ(f->capture_stacks_of.front(), 517);
  auto detail = nlohmann::json::parse(f->detail_json);
  EXPECT_EQ(detail["hung_ranks"].size(), kHungRanksDescribed);
  EXPECT_EQ(detail["hung_ranks_total"], 1000);
  ASSERT_EQ(f->lines.size(), kHungRanksDescribed + 1);
  EXPECT_NE(f->lines.back().text.find("936 more rank(s)"), std::string::npos);
}

TEST(HangDetectorTest, NoProgressButBusyEverywhereIsALongStepNotAHang) {
  Job job;
  for (int r = 0; r < 4; ++r) job.Put(r / 2, Rank(r, 10, 25, 0.5));
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
}

TEST(HangDetectorTest, OneQuietRankMakesItAHangWithEveryStuckRankAsEvidence) {
  Job job;
  job.Put(0, Rank(0, 10, 12, 0.2));  // waits in a collective, spinning
  job.Put(0, Rank(1, 10, 12, 0.2));
  job.Put(1, Rank(2, 10, 11, 11));  // quiet: the culprit
  job.Put(1, Rank(3, 10, 12, 0.2));
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, FindingKind::kHang);
  EXPECT_EQ(f->rank, 2);
  EXPECT_EQ(f->node, "node1");
  EXPECT_EQ(f->rank_step, 10);
  EXPECT_EQ(f->fault_wall, kNowWall - 11 * kSecond);
  EXPECT_EQ(f->hung_ranks, (std::vector<int>{0, 1, 2, 3}));
  // The culprit's stack first, then the others'.
  EXPECT_EQ(f->capture_stacks_of, (std::vector<int>{2, 0, 1, 3}));
  EXPECT_EQ(nlohmann::json::parse(f->detail_json)["hung_ranks"].size(), 4u);
  EXPECT_EQ(f->lines.size(), 4u);
  EXPECT_NE(f->culprit_evidence.find("rank 2 used no CPU or I/O while 3 other stuck rank(s) kept busy"),
            std::string::npos) << f->culprit_evidence;
}

// DDP on torch 1.13 journals no bucket all-reduce: its ranks wait in the
// backward phase. The rank elsewhere is the culprit, whichever was noticed
// first.
TEST(HangDetectorTest, TheRankOutsideCommunicationWhileOthersWaitInBackwardIsTheCulprit) {
  for (int stalled = 0; stalled < 4; ++stalled) {
    Job job;
    for (int r = 0; r < 4; ++r) {
      // All quiet (gloo waits on a condition variable); rank 0 noticed first.
      RankView v = Rank(r, 11, r == 0 ? 14 : 12, 12);
      v.status.set_phase(r == stalled ? "data" : "backward");
      job.Put(r / 2, v);
    }
    auto f = DetectHang(job.View(), Config());
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->rank, stalled);
    EXPECT_NE(f->culprit_evidence.find("outside any communication (phase 'data') while 3 rank(s) wait"),
              std::string::npos) << f->culprit_evidence;
    EXPECT_NE(f->description.find("; culprit: rank " + std::to_string(stalled)), std::string::npos)
        << f->description;
  }
}

TEST(HangDetectorTest, ARankWhoseGPUNeverStartedItsOperationIsTheCulprit) {
  Job job;
  for (int r = 0; r < 2; ++r) {
    RankView v = Rank(r, 11, r == 0 ? 14 : 12, 12);
    auto* op = v.status.add_ops_in_flight();
    op->set_op("all_reduce");
    op->set_seq(5);
    op->set_age_ms(12000);
    op->set_on_device(true);
    op->set_started_ms(r == 1 ? -1 : 3);
    job.Put(0, v);
  }
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
  EXPECT_NE(f->culprit_evidence.find("rank 1 issued all_reduce 12 s ago but its GPU never started it, while 1 "
                                     "rank(s) wait"),
            std::string::npos) << f->culprit_evidence;
}

TEST(HangDetectorTest, ARankBlockedInAFileReadIsAStorageStallNamingTheMount) {
  Job job;
  for (int r = 0; r < 4; ++r) {
    RankView v = Rank(r, 11, r == 0 ? 14 : 12, 12);
    v.status.set_phase(r == 3 ? "data" : "backward");
    job.Put(r / 2, v);
  }
  auto* b = job.nodes[1].ranks[3].status.add_blocked_io();
  b->set_call("read");
  b->set_path("/mnt/data/shard-3");
  b->set_mount_point("/mnt/data");
  b->set_fstype("fuse.sshfs");
  b->set_source("host:/data");
  b->set_blocked_ms(11000);
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 3);
  ASSERT_TRUE(f->verdict.has_value());
  EXPECT_EQ(f->verdict->category, "storage");
  EXPECT_EQ(f->verdict->rule_id, "storage-stall");
  EXPECT_TRUE(f->verdict->evict_nodes.empty());  // shared: evicting a node cannot help
  EXPECT_NE(f->culprit_evidence.find("rank 3 has been blocked 11 s in read() of /mnt/data/shard-3 on "
                                     "/mnt/data (fuse.sshfs host:/data), in phase 'data'"),
            std::string::npos) << f->culprit_evidence;
  // The node's own disk: the node goes.
  b->set_fstype("xfs");
  b->set_source("/dev/nvme0n1");
  f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value() && f->verdict.has_value());
  EXPECT_EQ(f->verdict->evict_nodes, std::vector<std::string>{"node1"});
  // Blocked for less than half the timeout: not yet a stall, no verdict.
  b->set_blocked_ms(2000);
  f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_FALSE(f->verdict.has_value());
}

TEST(HangDetectorTest, ARankWaitingForDataThatReadsNothingIsADataLoaderStall) {
  // An object-store read waits on a socket (state S): no call in a file
  // system, but nothing read for longer than half the timeout.
  Job job;
  for (int r = 0; r < 4; ++r) {
    RankView v = Rank(r, 11, r == 0 ? 14 : 12, 12);
    v.status.set_phase(r == 2 ? "data" : "backward");
    v.status.set_phase_age_ms(r == 2 ? 11500 : 200);
    v.status.mutable_io()->set_read_age_ms(r == 2 ? 11000 : 100);  // the others read their sockets
    job.Put(r / 2, v);
  }
  auto* file = job.nodes[1].ranks[2].status.mutable_io()->add_data_files();
  file->set_path("/mnt/data/shard-2");
  file->set_mount_point("/mnt/data");
  file->set_fstype("nfs4");
  file->set_source("filer:/data");
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 2);
  ASSERT_TRUE(f->verdict.has_value());
  EXPECT_EQ(f->verdict->rule_id, "data-loader-stall");
  EXPECT_EQ(f->verdict->category, "storage");
  EXPECT_TRUE(f->verdict->evict_nodes.empty());
  EXPECT_NE(f->culprit_evidence.find("rank 2 has waited for data (phase 'data') 11 s and its processes have read "
                                     "nothing for 11 s; its open files are on /mnt/data (nfs4 filer:/data, "
                                     "/mnt/data/shard-2)"),
            std::string::npos) << f->culprit_evidence;
  // Still reading (a slow store, not a stalled one): no storage verdict.
  job.nodes[1].ranks[2].status.mutable_io()->set_read_age_ms(300);
  f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_FALSE(f->verdict.has_value() && f->verdict->category == "storage");
  // Unknown read age (the first sample): no sign either.
  job.nodes[1].ranks[2].status.mutable_io()->set_read_age_ms(-1);
  f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_FALSE(f->verdict.has_value() && f->verdict->category == "storage");
}

TEST(HangDetectorTest, WhenNothingSetsARankApartNoneIsNamedTheCulprit) {
  Job job;
  for (int r = 0; r < 4; ++r) {
    RankView v = Rank(r, 11, r == 3 ? 13 : 12, 12);
    v.status.set_phase("backward");
    job.Put(r / 2, v);
  }
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->culprit_evidence, "");
  EXPECT_NE(f->description.find("; no rank stands out yet (noticed first: rank 3"), std::string::npos)
      << f->description;
  // A rank that stopped progressing well before all others stands out.
  job.nodes[1].ranks[3].status.set_progress_age_ms(19000);
  f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_NE(f->culprit_evidence.find("rank 3 stopped progressing 7.000 s before any other rank"),
            std::string::npos) << f->culprit_evidence;
}

TEST(HangDetectorTest, AStoppedProcessIsTheCulpritOverAQuietOne) {
  Job job;
  job.Put(0, Rank(0, 10, 30, 30));
  job.Put(1, Rank(1, 10, 11, 11, "T"));
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
}

TEST(HangDetectorTest, AgeCountsTheTimeSinceTheReportArrived) {
  Job job;
  RankView r = Rank(0, 10, 6, 6);
  r.received_mono = kNowMono - 5 * kSecond;  // 6 + 5 > 10
  job.Put(0, r);
  EXPECT_TRUE(DetectHang(job.View(), Config()).has_value());
  job.nodes[0].ranks[0].received_mono = kNowMono - 3 * kSecond;  // 6 + 3 <= 10
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
}

TEST(HangDetectorTest, BeforeTheFirstStepTheStartupTimeoutApplies) {
  Job job;
  job.Put(0, Rank(0, -1, 30, 30));
  job.nodes[0].ranks[0].status.set_step_count(0);
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
  job.nodes[0].ranks[0].status.set_progress_age_ms(61'000);
  job.nodes[0].ranks[0].status.set_activity_age_ms(61'000);
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_NE(f->description.find("before any step"), std::string::npos);
}

TEST(HangDetectorTest, UnattachedRanksStallOnlyWhenNothingMoves) {
  Job job;
  RankView r = Rank(0, -1, 0, 11);
  r.status.set_attached(false);
  job.Put(0, r);
  RankView busy = Rank(1, -1, 0, 1);
  busy.status.set_attached(false);
  job.Put(0, busy);
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->hung_ranks, std::vector<int>{0});
  // Not sampled: nothing is known, nothing is claimed.
  job.nodes[0].ranks[0].status.set_activity_sampled(false);
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
}

TEST(HangDetectorTest, ExitedRanksAreIgnored) {
  Job job;
  RankView r = Rank(0, 10, 100, 100);
  r.status.set_running(false);
  job.Put(0, r);
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
}

TEST(HangDetectorTest, AutoTimeoutFollowsTheSlowestStepAboveAFloor) {
  JobConfig c = Config();
  c.hang_timeout_auto = true;
  c.hang_timeout_multiple = 10;
  c.hang_timeout_floor = 5 * kSecond;
  Job job;
  job.Put(0, Rank(0, 50, 0, 0));
  job.Put(0, Rank(1, 50, 0, 0));
  // No step timed yet: the start-up allowance.
  EXPECT_EQ(EffectiveHangTimeout(job.View(), c), c.startup_timeout);
  job.nodes[0].ranks[0].status.set_max_step_ms(2000);
  job.nodes[0].ranks[1].status.set_max_step_ms(2500);
  EXPECT_EQ(EffectiveHangTimeout(job.View(), c), 25 * kSecond);
  job.nodes[0].ranks[1].status.set_max_step_ms(100);
  EXPECT_EQ(EffectiveHangTimeout(job.View(), c), 20 * kSecond);
  job.nodes[0].ranks[0].status.set_max_step_ms(10);
  EXPECT_EQ(EffectiveHangTimeout(job.View(), c), c.hang_timeout_floor);
  c.hang_timeout_auto = false;
  EXPECT_EQ(EffectiveHangTimeout(job.View(), c), c.hang_timeout);
}

TEST(HangDetectorTest, AutoTimeoutDetectsOnlyPastTheMultiple) {
  JobConfig c = Config();
  c.hang_timeout_auto = true;
  c.hang_timeout_floor = 1 * kSecond;
  Job job;
  RankView r = Rank(0, 50, 19, 19);
  r.status.set_max_step_ms(2000);
  job.Put(0, r);
  EXPECT_FALSE(DetectHang(job.View(), c).has_value());  // 19 s < 10 x 2 s
  job.nodes[0].ranks[0].status.set_progress_age_ms(21'000);
  job.nodes[0].ranks[0].status.set_activity_age_ms(21'000);
  auto f = DetectHang(job.View(), c);
  ASSERT_TRUE(f.has_value());
  EXPECT_NE(f->description.find("20.000 s (--hang-timeout auto)"), std::string::npos) << f->description;
}

TEST(HangDetectorTest, AnOperationInFlightPastTheTimeoutIsAHangEvenWhileBusy) {
  Job job;
  RankView spinning = Rank(0, 10, 12, 0.1);  // NCCL-style: waits busily
  auto* op = spinning.status.add_ops_in_flight();
  op->set_op("all_reduce");
  op->set_age_ms(11'000);
  job.Put(0, spinning);
  job.Put(0, Rank(1, 10, 12, 0.1));  // computing, never entered
  auto f = DetectHang(job.View(), Config());
  ASSERT_TRUE(f.has_value());
  EXPECT_NE(f->description.find("waiting in communication"), std::string::npos);
  job.nodes[0].ranks[0].status.mutable_ops_in_flight(0)->set_age_ms(9'000);
  EXPECT_FALSE(DetectHang(job.View(), Config()).has_value());
}

// HangDeadline is what lets the controller skip DetectHang between
// deadlines: for ranks of every kind (attached or not, sampled or not,
// before or after their first step, with or without operations in flight,
// stuck already or not), DetectHang finds nothing just before it and a hang
// just after it; and the deadline DetectHang reports is the earliest.
TEST(HangDetectorTest, HangDeadlineIsExactlyWhenDetectHangFirstFires) {
  std::mt19937 random(7);
  auto pick = [&](int n) { return static_cast<int>(random() % n); };
  int checked = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    JobConfig c = Config();
    c.hang_timeout_auto = pick(2) == 0;
    c.hang_timeout_floor = 8 * kSecond;
    Job job;
    Nanos timeout_lower_bound = LowestHangTimeout(c);
    const int ranks = 1 + pick(3);
    for (int i = 0; i < ranks; ++i) {
      RankView r = Rank(i, pick(3) == 0 ? 0 : 1 + pick(50), pick(30000) / 1000.0, pick(30000) / 1000.0);
      r.status.set_attached(pick(4) != 0);
      r.status.set_activity_sampled(pick(4) != 0);
      r.status.set_running(pick(10) != 0);
      if (pick(3) == 0) r.status.set_max_step_ms(200 + pick(2000));
      for (int k = pick(3); k > 0; --k) r.status.add_ops_in_flight()->set_age_ms(pick(30000));
      r.received_mono = kNowMono - pick(20000) * kMillisecond;
      job.Put(i % 2, r);
    }
    JobView view = job.View();
    Nanos reported = 0;
    DetectHang(view, c, &reported);
    Nanos earliest = kNoHangDeadline, lowest = kNoHangDeadline;
    const Nanos timeout = EffectiveHangTimeout(view, c);
    for (const NodeView* n : view.nodes) {
      for (const auto& [rank, rv] : n->ranks) {
        earliest = std::min(earliest, HangDeadline(rv, timeout, c));
        lowest = std::min(lowest, HangDeadline(rv, timeout_lower_bound, c));
      }
    }
    ASSERT_EQ(reported, earliest) << "trial " << trial;
    ASSERT_LE(lowest, earliest) << "a lower timeout must never give a later deadline (trial " << trial << ")";
    if (earliest == kNoHangDeadline) {
      view.now_mono = kNowMono + 3600 * kSecond;
      EXPECT_FALSE(DetectHang(view, c).has_value()) << "trial " << trial;
      continue;
    }
    view.now_mono = earliest;  // DetectHang's tests are strict: not yet
    EXPECT_FALSE(DetectHang(view, c).has_value()) << "trial " << trial;
    view.now_mono = earliest + 1;
    EXPECT_TRUE(DetectHang(view, c).has_value()) << "trial " << trial;
    ++checked;
  }
  EXPECT_GT(checked, 500);  // most trials have a deadline
}

}  // namespace
}  // namespace trainguard
