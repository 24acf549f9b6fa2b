#include "store/event_store.h"

#include <gtest/gtest.h>

#include <set>
#include <unistd.h>

#include <functional>

namespace trainguard {
namespace {

// The same suite runs against every implementation.
class EventStoreTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_unique<InMemoryEventStore>();
    } else {
      path_ = testing::TempDir() + "/event_store_test_" + std::to_string(getpid()) + ".db";
      unlink(path_.c_str());
      auto s = OpenSqliteEventStore(path_);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      store_ = std::move(s.value());
    }
  }
  void TearDown() override {
    store_.reset();
    if (!path_.empty()) {
      unlink(path_.c_str());
      unlink((path_ + "-wal").c_str());
      unlink((path_ + "-shm").c_str());
    }
  }
  std::unique_ptr<EventStore> store_;
  std::string path_;
};

TEST_P(EventStoreTest, RoundTripsJobsAndEventsInOrder) {
  ASSERT_TRUE(store_->CreateJob({"j1", 10, "python train.py", "{}", "STARTING", ""}).ok());
  ASSERT_TRUE(store_->CreateJob({"j2", 20, "x", "{}", "STARTING", ""}).ok());
  EXPECT_FALSE(store_->CreateJob({"j1", 30, "y", "{}", "STARTING", ""}).ok());
  for (int i = 0; i < 5; ++i) {
    Event e;
    e.job_id = i == 2 ? "j2" : "j1";
    e.wall_ns = 100 + i;
    e.kind = "k" + std::to_string(i);
    e.node = "node0";
    e.rank = i;
    e.generation = 1;
    e.step = 40 + i;
    e.message = "m";
    e.detail_json = R"({"a":1})";
    ASSERT_TRUE(store_->Append(e).ok());
  }
  auto events = store_->Events("j1");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 4u);
  EXPECT_EQ((*events)[0].kind, "k0");
  EXPECT_EQ((*events)[2].kind, "k3");
  EXPECT_EQ((*events)[2].step, 43);
  EXPECT_EQ((*events)[2].detail_json, R"({"a":1})");
  EXPECT_LT((*events)[0].id, (*events)[1].id);

  // Pages after an id: the other job's events are skipped, the limit holds.
  auto after = store_->EventsAfter("j1", (*events)[0].id, 2);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ((*after)[0].kind, "k1");
  EXPECT_EQ((*after)[1].kind, "k3");
  auto rest = store_->EventsAfter("j1", (*after)[1].id, -1);
  ASSERT_TRUE(rest.ok());
  ASSERT_EQ(rest->size(), 1u);
  EXPECT_EQ((*rest)[0].kind, "k4");
  auto none = store_->EventsAfter("j1", (*rest)[0].id, 10);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  ASSERT_TRUE(store_->UpdateJob("j1", "SUCCEEDED", "done").ok());
  EXPECT_EQ(store_->UpdateJob("nope", "FAILED", "").code(), StatusCode::kNotFound);
  auto jobs = store_->Jobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id, "j1");
  EXPECT_EQ((*jobs)[0].state, "SUCCEEDED");
  EXPECT_EQ((*jobs)[0].summary, "done");
}

TEST_P(EventStoreTest, KeepsIncidentsAndNodeHealthAcrossJobs) {
  ASSERT_TRUE(store_->RecordIncident({"j1", 1, 10, "node3", 5, "gpu_hardware", "gpu-off-bus",
                                      "evict_node", 40, "{}"}).ok());
  ASSERT_TRUE(store_->RecordIncident({"j2", 1, 20, "node1", 0, "oom", "oom-gpu", "stop", 7, "{}"}).ok());
  ASSERT_TRUE(store_->RecordIncident({"j2", 2, 30, "node3", 2, "gpu_hardware", "gpu-ecc",
                                      "evict_node", 9, "{}"}).ok());
  auto on3 = store_->IncidentsOnNode("node3");
  ASSERT_TRUE(on3.ok());
  ASSERT_EQ(on3->size(), 2u);
  EXPECT_EQ((*on3)[0].job_id, "j1");
  EXPECT_EQ((*on3)[1].rule, "gpu-ecc");
  EXPECT_EQ(store_->IncidentsOnNode("")->size(), 3u);

  EXPECT_EQ(store_->GetNodeHealth("node3")->status, "");
  ASSERT_TRUE(store_->SetNodeHealth({"node3", "suspect", "Xid 79", "j2", 30}).ok());
  ASSERT_TRUE(store_->SetNodeHealth({"node3", "suspect", "ECC", "j3", 40}).ok());
  auto h = store_->GetNodeHealth("node3");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->status, "suspect");
  EXPECT_EQ(h->reason, "ECC");
  EXPECT_EQ(h->job_id, "j3");
  ASSERT_TRUE(store_->SetNodeHealth({"node1", "ok", "cleared", "", 50}).ok());
  auto all = store_->ListNodeHealth();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].node, "node1");
  EXPECT_EQ((*all)[0].status, "ok");
  EXPECT_EQ((*all)[1].node, "node3");
  EXPECT_EQ((*all)[1].reason, "ECC");
}

TEST_P(EventStoreTest, KeepsEveryActionOnANodeInOrder) {
  ASSERT_TRUE(store_->RecordNodeAction({"node2", 10, "evict", "controller of job j1", "compute 48 % of median",
                                        "j1", R"({"compute_gflops":1.2})"}).ok());
  ASSERT_TRUE(store_->RecordNodeAction({"node1", 20, "cordon", "operator root@h", "bad fan", "", ""}).ok());
  ASSERT_TRUE(store_->RecordNodeAction({"node2", 30, "uncordon", "operator root@h", "fixed", "", ""}).ok());
  auto on2 = store_->NodeActions("node2");
  ASSERT_TRUE(on2.ok());
  ASSERT_EQ(on2->size(), 2u);
  EXPECT_EQ((*on2)[0].action, "evict");
  EXPECT_EQ((*on2)[0].by, "controller of job j1");
  EXPECT_EQ((*on2)[0].evidence_json, R"({"compute_gflops":1.2})");
  EXPECT_EQ((*on2)[1].action, "uncordon");
  auto all = store_->NodeActions("");
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[1].node, "node1");
  if (GetParam() == std::string("sqlite")) EXPECT_EQ((*all)[1].evidence_json, "{}");
}

TEST_P(EventStoreTest, KeepsTheNewestDiagnosticsOfEachNode) {
  EXPECT_TRUE(store_->LatestDiagnostics()->empty());
  ASSERT_TRUE(store_->RecordDiagnostics({"node2", 10, "quick", "", R"([{"name":"compute_gflops","value":1}])"}).ok());
  ASSERT_TRUE(store_->RecordDiagnostics({"node1", 20, "full", "j1", "[]"}).ok());
  // An older clock on a later record still replaces: the newest record is the last one written.
  ASSERT_TRUE(store_->RecordDiagnostics({"node2", 5, "quick", "", R"([{"name":"compute_gflops","value":2}])"}).ok());
  auto latest = store_->LatestDiagnostics();
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].node, "node1");
  EXPECT_EQ((*latest)[0].mode, "full");
  EXPECT_EQ((*latest)[0].job_id, "j1");
  EXPECT_EQ((*latest)[1].node, "node2");
  EXPECT_EQ((*latest)[1].wall_ns, 5);
  EXPECT_EQ((*latest)[1].figures_json, R"([{"name":"compute_gflops","value":2}])");
}

TEST_P(EventStoreTest, KeepsStepTimingsReplacesRepeatsAndCompactsOldSteps) {
  std::vector<StepTimingRecord> rows;
  for (std::int64_t step = 0; step < 30; ++step) {
    for (int rank = 1; rank >= 0; --rank) {
      rows.push_back({"j1", 0, rank, "node" + std::to_string(rank), step, 1000 * step, 900, 5,
                      "forward=400", "forward,1,0,400"});
    }
  }
  rows.push_back({"j2", 0, 0, "nodeX", 3, 0, 1, 0, "", ""});
  ASSERT_TRUE(store_->AppendStepTimings(rows).ok());
  // The same step of the same generation again replaces; a new generation adds.
  ASSERT_TRUE(store_->AppendStepTimings({{"j1", 0, 0, "node0", 5, 5000, 777, 5, "forward=1", "x"},
                                         {"j1", 1, 0, "node0", 5, 9000, 800, 5, "forward=2", "y"}}).ok());
  auto some = store_->StepTimings("j1", 5, 6);
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 5u);
  EXPECT_EQ((*some)[0].rank, 0);
  EXPECT_EQ((*some)[0].generation, 0);
  EXPECT_EQ((*some)[0].duration_us, 777);
  EXPECT_EQ((*some)[1].rank, 1);
  EXPECT_EQ((*some)[2].generation, 1);
  EXPECT_EQ((*some)[2].intervals, "y");
  EXPECT_EQ((*some)[3].step, 6);
  EXPECT_EQ((*some)[3].node, "node0");
  EXPECT_EQ((*some)[3].start_us, 6000);
  EXPECT_EQ((*some)[3].clock_error_us, 5);
  EXPECT_EQ((*some)[3].totals, "forward=400");

  ASSERT_TRUE(store_->CompactStepTimings("j1", 20, 10).ok());
  auto all = store_->StepTimings("j1", 0, 100);
  ASSERT_TRUE(all.ok());
  std::set<std::int64_t> steps;
  for (const auto& r : *all) {
    steps.insert(r.step);
    EXPECT_EQ(r.intervals.empty(), r.step < 20) << r.step;
    EXPECT_FALSE(r.totals.empty());
  }
  EXPECT_EQ(steps, (std::set<std::int64_t>{0, 10, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29}));
  EXPECT_EQ(store_->StepTimings("j2", 0, 100)->size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(All, EventStoreTest, testing::Values("memory", "sqlite"));

TEST(SqliteEventStoreTest, EventsSurviveReopen) {
  std::string path = testing::TempDir() + "/reopen_" + std::to_string(getpid()) + ".db";
  unlink(path.c_str());
  {
    auto s = OpenSqliteEventStore(path);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->CreateJob({"j", 1, "c", "{}", "RUNNING", ""}).ok());
    Event e;
    e.job_id = "j";
    e.kind = "rank_exited";
    ASSERT_TRUE((*s)->Append(e).ok());
  }
  auto s = OpenSqliteEventStore(path);
  ASSERT_TRUE(s.ok());
  auto events = (*s)->Events("j");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].kind, "rank_exited");
  unlink(path.c_str());
}

TEST(SqliteEventStoreTest, UnwritablePathIsAClearError) {
  auto s = OpenSqliteEventStore("/nonexistent-dir/x/store.db");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError);
  EXPECT_NE(s.status().message().find("/nonexistent-dir/x/store.db"), std::string::npos);
}

}  // namespace
}  // namespace trainguard
