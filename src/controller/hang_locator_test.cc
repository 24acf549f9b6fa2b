// Hang localization on hand-made journals: a 2 x 2 x 2 (tp x dp x pp) job.
#include "controller/hang_locator.h"

#include <gtest/gtest.h>

#include "controller/recovery_policy.h"

#include <map>
#include <set>

namespace trainguard {
namespace {

// Ranks 0..7; tp groups {0,1},{2,3},..; dp groups {0,2},{1,3},{4,6},{5,7};
// pp groups {0,4},{1,5},{2,6},{3,7} (stage 0: ranks 0-3, stage 1: 4-7).
class Job {
 public:
  explicit Job(int world = 8) {
    nodes_.resize(world / 2);
    for (int r = 0; r < world; ++r) {
      NodeView& n = nodes_[r / 2];
      n.node_id = "node" + std::to_string(r / 2);
      RankView& v = n.ranks[r];
      v.status.set_global_rank(r);
      v.status.set_running(true);
      v.status.set_attached(true);
      v.status.set_proc_state("S");
      v.status.set_step(10);
      v.status.set_activity_sampled(true);
      v.status.set_activity_age_ms(100);
    }
  }
  v1::RankStatus& Rank(int r) { return nodes_[r / 2].ranks[r].status; }

  // Group `id` with `members` in rank r's table, `issued` collectives issued.
  void Group(int r, int id, const std::string& name, std::vector<int> members, std::int64_t issued) {
    auto* g = Rank(r).add_groups();
    g->set_id(id);
    g->set_name(name);
    g->set_size(static_cast<int>(members.size()));
    for (int m : members) g->add_members(m);
    g->set_issued(issued);
  }
  void Layout3D(const std::string& tp = "", const std::string& dp = "", const std::string& pp = "") {
    for (int r = 0; r < 8; ++r) {
      Group(r, 0, "0", {0, 1, 2, 3, 4, 5, 6, 7}, 3);
      Group(r, 10 + r / 2, tp, {r / 2 * 2, r / 2 * 2 + 1}, 20);
      int dp_first = (r / 4) * 4 + r % 2;
      Group(r, 20 + dp_first, dp, {dp_first, dp_first + 2}, 41);
      Group(r, 30 + r % 4, pp, {r % 4, r % 4 + 4}, 0);
      int peer = r < 4 ? r + 4 : r - 4;
      auto* p = Rank(r).add_peers();
      p->set_peer(peer);
      p->set_sends(9);
      p->set_recvs(9);
    }
  }
  void InFlight(int r, const std::string& op, int group, std::int64_t seq, int peer = -1,
                std::int64_t numel = 100, std::int64_t age_ms = 30000) {
    auto* o = Rank(r).add_ops_in_flight();
    o->set_op(op);
    o->set_group_id(group);
    o->set_seq(seq);
    o->set_peer(peer);
    o->set_numel(numel);
    o->set_age_ms(age_ms);
    o->set_duration_ms(-1);
  }
  void Issued(int r, int group, std::int64_t issued) {
    for (auto& g : *Rank(r).mutable_groups()) {
      if (g.id() == group) g.set_issued(issued);
    }
  }
  JobView View() const {
    JobView v;
    for (const auto& n : nodes_) v.nodes.push_back(&n);
    return v;
  }

 private:
  std::vector<NodeView> nodes_;
};

TEST(HangLocatorTest, InfersTheLayoutFromGroupShapesAndPointToPointTraffic) {
  Job job;
  job.Layout3D();
  HangLocation loc = LocateHang(job.View());
  ASSERT_EQ(loc.layout.size(), 3u);
  EXPECT_EQ(loc.layout[0].name, "tp");
  EXPECT_EQ(loc.layout[0].stride, 1);
  EXPECT_EQ(loc.layout[1].name, "pp");
  EXPECT_EQ(loc.layout[1].stride, 4);
  EXPECT_EQ(loc.layout[2].name, "dp");
  EXPECT_EQ(loc.layout[2].stride, 2);
  EXPECT_EQ(loc.Name(5), "rank 5 (tp1 pp1 dp0)");
  EXPECT_EQ(loc.Name(2), "rank 2 (tp0 pp0 dp1)");
  EXPECT_TRUE(loc.roots.empty());
}

TEST(HangLocatorTest, APipelineOfSendAndRecvOnTheWorldGroupIsADimension) {
  // rank = tp + 2 * pp + 4 * dp; tp and dp groups only, the stages talk
  // with send/recv on the world group.
  Job job;
  for (int r = 0; r < 8; ++r) {
    job.Group(r, 0, "", {0, 1, 2, 3, 4, 5, 6, 7}, 3);
    job.Group(r, 10 + r / 2, "", {r / 2 * 2, r / 2 * 2 + 1}, 20);
    job.Group(r, 20 + r % 4, "", {r % 4, r % 4 + 4}, 41);
    auto* p = job.Rank(r).add_peers();
    p->set_peer(r % 4 < 2 ? r + 2 : r - 2);
    p->set_sends(9);
    p->set_recvs(9);
  }
  HangLocation loc = LocateHang(job.View());
  ASSERT_EQ(loc.layout.size(), 3u);
  EXPECT_EQ(loc.layout[0].name, "tp");
  EXPECT_EQ(loc.layout[1].name, "pp");
  EXPECT_EQ(loc.layout[1].size, 2);
  EXPECT_EQ(loc.layout[1].stride, 2);
  EXPECT_EQ(loc.layout[2].name, "dp");
  EXPECT_EQ(loc.layout[2].stride, 4);
  EXPECT_EQ(loc.Name(0), "rank 0 (tp0 pp0 dp0)");
  EXPECT_EQ(loc.Name(2), "rank 2 (tp0 pp1 dp0)");
  EXPECT_EQ(loc.Name(7), "rank 7 (tp1 pp1 dp1)");
  std::set<std::map<std::string, int>> distinct;
  for (const RankWait& w : loc.ranks) distinct.insert(w.coords);
  EXPECT_EQ(distinct.size(), 8u);
}

TEST(HangLocatorTest, AGroupWithAnotherGroupsMembersDoesNotHideItsDimension) {
  Job job;
  job.Layout3D();
  // Megatron's embedding group: the first and last stage, here the
  // pipeline group's members again.
  for (int r = 0; r < 8; ++r) job.Group(r, 40 + r % 4, "embedding", {r % 4, r % 4 + 4}, 2);
  HangLocation loc = LocateHang(job.View());
  ASSERT_EQ(loc.layout.size(), 3u);
  EXPECT_EQ(loc.Name(5), "rank 5 (tp1 pp1 dp0)");
}

TEST(HangLocatorTest, PlainDataParallelHasNoDimensionAndAPurePipelineHasOne) {
  Job ddp(4);
  for (int r = 0; r < 4; ++r) ddp.Group(r, 0, "", {0, 1, 2, 3}, 50);
  EXPECT_TRUE(LocateHang(ddp.View()).layout.empty());
  Job pipeline(4);
  for (int r = 0; r < 4; ++r) {
    pipeline.Group(r, 0, "", {0, 1, 2, 3}, 1);
    for (int peer : {r - 1, r + 1}) {
      if (peer < 0 || peer > 3) continue;
      auto* p = pipeline.Rank(r).add_peers();
      p->set_peer(peer);
      p->set_sends(5);
      p->set_recvs(5);
    }
  }
  HangLocation loc = LocateHang(pipeline.View());
  ASSERT_EQ(loc.layout.size(), 1u);
  EXPECT_EQ(loc.layout[0].name, "pp");
  EXPECT_EQ(loc.layout[0].size, 4);
  EXPECT_EQ(loc.Name(3), "rank 3 (pp3)");
}

TEST(HangLocatorTest, GroupNamesOutweighTheShapeHeuristics) {
  Job job;
  // Named the other way round from what the strides would suggest.
  job.Layout3D("data_parallel", "tensor_model_parallel", "pipeline");
  HangLocation loc = LocateHang(job.View());
  EXPECT_EQ(loc.Name(5), "rank 5 (tp0 pp1 dp1)");
}

TEST(HangLocatorTest, TheRankThatNeverEnteredIsTheRootAndItsWaitersAreNamed) {
  Job job;
  job.Layout3D();
  // Rank 5 is computing and never entered: dp all_reduce #42 (rank 7 waits),
  // tp all_reduce #21 (rank 4 waits), and never sent pipeline message #10
  // that rank 1 waits to receive.
  job.Issued(7, 25, 42);
  job.InFlight(7, "all_reduce", 25, 42);
  job.Issued(4, 12, 21);
  job.InFlight(4, "all_reduce", 12, 21);
  job.InFlight(1, "recv", 0, 10, 5);
  HangLocation loc = LocateHang(job.View());
  ASSERT_EQ(loc.roots, std::vector<int>{5});
  EXPECT_EQ(loc.ranks[5].state, "computing");
  EXPECT_EQ(loc.ranks[7].waits_for, std::vector<int>{5});
  EXPECT_EQ(loc.ranks[7].group, "dp");
  EXPECT_EQ(loc.ranks[4].waits_for, std::vector<int>{5});
  EXPECT_EQ(loc.ranks[1].waits_for, std::vector<int>{5});
  ASSERT_FALSE(loc.explanation.empty());
  const std::string& first = loc.explanation.front();
  EXPECT_NE(first.find("rank 5 (tp1 pp1 dp0) never"), std::string::npos) << first;
  EXPECT_NE(first.find("3 rank(s) wait for it"), std::string::npos) << first;
  EXPECT_TRUE(loc.desynchronized.empty());
  nlohmann::json j = loc.ToJson();
  EXPECT_EQ(j["roots"], nlohmann::json::array({5}));
  EXPECT_EQ(j["ranks"][7]["op"], "all_reduce");
  EXPECT_EQ(j["ranks"][7]["seq"], 42);
  EXPECT_EQ(j["ranks"][5]["coords"]["pp"], 1);
}

// The lent H200's case: two ranks, CUDA tensors; rank 1's GPU is busy in a
// kernel queued before the step's all_reduce. Both issued #5: only the
// device-side start tells the stuck rank from the one waiting inside.
TEST(HangLocatorTest, ARankWhoseGPUNeverStartedTheCollectiveIsTheRootNotItsWaitingPeer) {
  Job job(2);
  for (int r = 0; r < 2; ++r) {
    job.Group(r, 0, "", {0, 1}, 5);
    job.InFlight(r, "all_reduce", 0, 5, -1, 1 << 20, r == 0 ? 41000 : 40000);
    auto* op = job.Rank(r).mutable_ops_in_flight(0);
    op->set_on_device(true);
    op->set_started_ms(r == 0 ? 2 : -1);
    job.Rank(r).set_activity_age_ms(40000);
  }
  HangLocation loc = LocateHang(job.View());
  ASSERT_EQ(loc.roots, std::vector<int>{1});
  EXPECT_EQ(loc.ranks[1].state, "device");
  EXPECT_EQ(loc.ranks[0].state, "waiting");
  EXPECT_EQ(loc.ranks[0].waits_for, std::vector<int>{1});
  ASSERT_FALSE(loc.explanation.empty());
  EXPECT_NE(loc.explanation.front().find("rank 1 issued all_reduce #5 of its world group 40 s ago, but its "
                                         "GPU never started it"),
            std::string::npos) << loc.explanation.front();
  EXPECT_EQ(loc.ToJson()["ranks"][0]["started_ms"], 2);
  EXPECT_EQ(loc.ToJson()["ranks"][1]["started_ms"], -1);
  EXPECT_EQ(loc.ToJson()["ranks"][1]["state"], "device");

  // The finding and the blame: rank 1 on node0, a device hang, not comm_hang.
  Finding f;
  f.kind = FindingKind::kHang;
  f.rank = 0;
  f.node = "node0";
  f.description = "2 rank(s) made no progress; no rank stands out yet (noticed first: rank 0)";
  AttachLocation(loc, &f);
  EXPECT_EQ(f.rank, 1);
  EXPECT_NE(f.culprit_evidence.find("its GPU never started it"), std::string::npos);
  auto rules = RuleSet::Load(TG_RULES_FILE);
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  Incident inc;
  inc.kind = FindingKind::kHang;
  inc.first_rank = f.rank;
  inc.hung_ranks = {0, 1};
  inc.hang_roots = f.roots;
  inc.hang_evidence = f.culprit_evidence;
  for (const auto& l : f.lines) inc.AddLine(l);
  inc.AddLine({0, "node0", "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Timed out waiting for recv"});
  Blame b = AssignBlame(&*rules, inc, [](int) { return std::string("node0"); });
  EXPECT_EQ(b.attribution.category, "gpu_hardware");
  EXPECT_EQ(b.attribution.rule_id, "gpu-device-hang");
  EXPECT_EQ(b.culprit_ranks, std::vector<int>{1});

  // Once its GPU reached the operation, rank 1 waits like its peer: the
  // operation itself is stuck, nobody is the root.
  job.Rank(1).mutable_ops_in_flight(0)->set_started_ms(39000);
  loc = LocateHang(job.View());
  EXPECT_TRUE(loc.roots.empty());
  EXPECT_EQ(loc.ranks[1].state, "waiting");
}

TEST(HangLocatorTest, AChainLeadsToItsRoot) {
  Job job;
  job.Layout3D();
  // Rank 0 waits in tp #21 for rank 1; rank 1 waits to receive from rank 5,
  // which never sent: the root is 5, not 1.
  job.Issued(0, 10, 21);
  job.InFlight(0, "all_reduce", 10, 21);
  job.InFlight(1, "recv", 0, 10, 5);
  HangLocation loc = LocateHang(job.View());
  EXPECT_EQ(loc.roots, std::vector<int>{5});
  EXPECT_EQ(loc.ranks[0].waits_for, std::vector<int>{1});
}

TEST(HangLocatorTest, AStoppedRankInsideTheCollectiveIsTheRoot) {
  Job job;
  job.Layout3D();
  for (int r : {5, 7}) {
    job.Issued(r, 25, 42);
    job.InFlight(r, "all_reduce", 25, 42);
  }
  job.Rank(5).set_proc_state("T");
  HangLocation loc = LocateHang(job.View());
  EXPECT_EQ(loc.roots, std::vector<int>{5});
  EXPECT_EQ(loc.ranks[5].state, "stopped");
  EXPECT_NE(loc.explanation.front().find("is stopped"), std::string::npos);
}

TEST(HangLocatorTest, ADifferentCollectiveAtTheSameSequenceNumberIsDesynchronised) {
  Job job;
  job.Layout3D();
  for (int r = 0; r < 8; ++r) {
    job.Issued(r, 0, 4);
    job.InFlight(r, r == 3 ? "broadcast" : "all_reduce", 0, 4);
  }
  HangLocation loc = LocateHang(job.View());
  EXPECT_EQ(loc.desynchronized, std::vector<int>{3});
  ASSERT_FALSE(loc.roots.empty());
  EXPECT_EQ(loc.roots.front(), 3);
  bool said = false;
  for (const auto& e : loc.explanation) said |= e.find("rank 3 (tp1 pp0 dp1) issued broadcast") == 0;
  EXPECT_TRUE(said);
}

TEST(HangLocatorTest, AnAllReduceOfAnotherSizeIsDesynchronised) {
  Job job(4);
  for (int r = 0; r < 4; ++r) {
    job.Group(r, 0, "", {0, 1, 2, 3}, 9);
    job.InFlight(r, "all_reduce", 0, 9, -1, r == 2 ? 64 : 128);
  }
  EXPECT_EQ(LocateHang(job.View()).desynchronized, std::vector<int>{2});
}

TEST(HangLocatorTest, ReceivesThatWaitForEachOtherAreADeadlock) {
  Job job(2);
  for (int r = 0; r < 2; ++r) {
    job.Group(r, 0, "", {0, 1}, 1);
    auto* p = job.Rank(r).add_peers();
    p->set_peer(1 - r);
    p->set_recvs(1);
    job.InFlight(r, "recv", 0, 1, 1 - r);
  }
  HangLocation loc = LocateHang(job.View());
  EXPECT_EQ(loc.roots, (std::vector<int>{0, 1}));
  EXPECT_NE(loc.explanation.back().find("deadlock"), std::string::npos);
}

TEST(HangLocatorTest, AnOperationEveryMemberEnteredIsStuckInside) {
  Job job(2);
  for (int r = 0; r < 2; ++r) {
    job.Group(r, 0, "", {0, 1}, 5);
    job.InFlight(r, "all_reduce", 0, 5);
  }
  HangLocation loc = LocateHang(job.View());
  EXPECT_TRUE(loc.roots.empty());
  ASSERT_EQ(loc.explanation.size(), 1u);
  EXPECT_NE(loc.explanation[0].find("every member entered"), std::string::npos);
}

TEST(HangLocatorTest, WithoutJournalsNothingIsLocated) {
  Job job(2);
  HangLocation loc = LocateHang(job.View());
  EXPECT_FALSE(loc.has_journal);
  Finding f;
  f.rank = 1;
  f.description = "d";
  AttachLocation(loc, &f);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.description, "d");
  EXPECT_EQ(f.detail_json, "{}");
}

TEST(HangLocatorTest, TheLocationNamesTheFindingsCulprit) {
  Job job;
  job.Layout3D();
  job.Issued(7, 25, 42);
  job.InFlight(7, "all_reduce", 25, 42);
  Finding f;
  f.rank = 7;
  f.node = "node3";
  f.description = "2 rank(s) made no progress";
  AttachLocation(LocateHang(job.View()), &f);
  EXPECT_EQ(f.rank, 5);
  EXPECT_EQ(f.node, "node2");
  EXPECT_EQ(f.roots, std::vector<int>{5});
  EXPECT_NE(f.description.find("rank 5 (tp1 pp1 dp0) never entered all_reduce #42 of its dp group"),
            std::string::npos)
      << f.description;
  EXPECT_EQ(nlohmann::json::parse(f.detail_json)["location"]["roots"], nlohmann::json::array({5}));
}

TEST(HangLocatorTest, ScalesLinearlyWithTheRanksWaitingInOneCollective) {
  // 100,000 ranks (tp groups of 8, pipeline pairs across halves): all but
  // rank 77 wait in all_reduce #5 of the world group, which 77 never entered.
  // A pass per waiter over the group's members would take ~10^10 steps.
  constexpr int kWorld = 100'000;
  std::vector<NodeView> nodes(kWorld / 8);
  for (int r = 0; r < kWorld; ++r) {
    NodeView& n = nodes[r / 8];
    n.node_id = "node" + std::to_string(r / 8);
    v1::RankStatus& s = n.ranks[r].status;
    s.set_global_rank(r);
    s.set_running(true);
    s.set_proc_state("S");
    auto* world = s.add_groups();
    world->set_id(0);
    world->set_size(kWorld);
    world->set_first(0);
    world->set_stride(1);
    world->set_issued(r == 77 ? 4 : 5);
    auto* tp = s.add_groups();
    tp->set_id(1 + r / 8);
    tp->set_size(8);
    tp->set_first(r / 8 * 8);
    tp->set_stride(1);
    auto* pp = s.add_groups();
    pp->set_id(100'000 + r % (kWorld / 2));
    pp->set_size(2);
    pp->set_first(r % (kWorld / 2));
    pp->set_stride(kWorld / 2);
    auto* peer = s.add_peers();
    peer->set_peer((r + kWorld / 2) % kWorld);
    peer->set_sends(3);
    peer->set_recvs(3);
    if (r != 77) {
      auto* op = s.add_ops_in_flight();
      op->set_op("all_reduce");
      op->set_group_id(0);
      op->set_seq(5);
      op->set_peer(-1);
      op->set_age_ms(40'000);
    }
  }
  JobView view;
  for (const auto& n : nodes) view.nodes.push_back(&n);
  HangLocation loc = LocateHang(view);
  ASSERT_EQ(loc.roots, std::vector<int>{77});
  EXPECT_EQ(loc.ranks[5].waits_for, std::vector<int>{77});
  // Data parallelism runs on the world group: what tells apart the ranks
  // with equal tp and pp coordinates.
  ASSERT_EQ(loc.layout.size(), 3u);
  EXPECT_EQ(loc.layout[0].name, "tp");
  EXPECT_EQ(loc.layout[1].name, "pp");
  EXPECT_EQ(loc.layout[2].name, "dp");
  EXPECT_EQ(loc.layout[2].size, kWorld / 16);
  EXPECT_EQ(loc.layout[2].stride, 8);
  EXPECT_EQ(loc.Name(77), "rank 77 (tp5 pp0 dp9)");
  EXPECT_NE(loc.explanation.front().find("99999 rank(s) wait for it"), std::string::npos)
      << loc.explanation.front();
  EXPECT_NE(loc.explanation.front().find("and 99991 more"), std::string::npos);
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

// A world of 10,000 ranks waiting in one collective that rank 7,777 never
// entered: the root is found, and the JSON lists it among a bounded number.
TEST(HangLocatorTest, AHugeWorldIsListedInPartRootFirst) {
  const int world = 10000;
  Job job(world);
  for (int r = 0; r < world; ++r) {
    job.Group(r, 0, "0", {}, r == 7777 ? 3 : 4);
    auto* g = job.Rank(r).mutable_groups(0);
    g->set_size(world);
    g->set_first(0);
    g->set_stride(1);
    g->set_completed(3);
    if (r != 7777) job.InFlight(r, "all_reduce", 0, 4);
  }
  HangLocation loc = LocateHang(job.View());
  ASSERT_EQ(loc.roots, std::vector<int>{7777});
  nlohmann::json j = loc.ToJson();
  ASSERT_EQ(j["ranks"].size(), kLocatedRanksListed);
  EXPECT_EQ(j["ranks_total"], world);
  bool root_listed = false;
  for (const auto& r : j["ranks"]) root_listed |= r["rank"] == 7777;
  EXPECT_TRUE(root_listed);
}

}  // namespace
}  // namespace trainguard
