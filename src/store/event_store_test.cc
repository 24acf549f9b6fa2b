#include "store/event_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

#include <sqlite3.h>

#include "store/postgres_test_server.h"
#include "testing/scratch_dir.h"
#include "testing/wait_until.h"

namespace trainguard {
namespace {

// One real PostgreSQL server for the whole binary, started on first use; a
// database of its own for every test.
PostgresTestServer* SharedServer() {
  static PostgresTestServer* server = [] {
    auto* s = new PostgresTestServer();
    Status started = s->Start();
    if (!started.ok()) {
      std::fprintf(stderr, "cannot start the PostgreSQL test server: %s\n", started.ToString().c_str());
      delete s;
      return static_cast<PostgresTestServer*>(nullptr);
    }
    std::atexit([] { SharedServer()->Stop(); });
    return s;
  }();
  return server;
}

std::string FreshDatabase() {
  static std::atomic<int> next{0};
  PostgresTestServer* server = SharedServer();
  if (server == nullptr) return "";
  auto url = server->CreateDatabase("t" + std::to_string(getpid()) + "_" + std::to_string(next++));
  return url.ok() ? *url : "";
}

// The same suite runs against every implementation.
class EventStoreTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_unique<InMemoryEventStore>();
      return;
    }
    if (GetParam() == "postgres") {
      where_ = FreshDatabase();
      ASSERT_FALSE(where_.empty()) << "no PostgreSQL test server (see stderr)";
    } else {
      path_ = testing::TempDir() + "/event_store_test_" + std::to_string(getpid()) + ".db";
      unlink(path_.c_str());
      where_ = path_;
    }
    auto s = OpenEventStore(where_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s.value());
  }
  void TearDown() override {
    others_.clear();
    store_.reset();
    if (!path_.empty()) {
      unlink(path_.c_str());
      unlink((path_ + "-wal").c_str());
      unlink((path_ + "-shm").c_str());
    }
  }
  // Another connection to the same store, as another controller's (in
  // memory: the same store). Null if it cannot be opened.
  EventStore* Another() {
    if (GetParam() == "memory") return store_.get();
    auto s = OpenEventStore(where_);
    if (!s.ok()) return nullptr;
    others_.push_back(std::move(s.value()));
    return others_.back().get();
  }
  std::unique_ptr<EventStore> store_;
  std::vector<std::unique_ptr<EventStore>> others_;
  std::string where_;  // what OpenEventStore was given ("" in memory)
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

  ASSERT_TRUE(store_->UpdateJob("j1", "SUCCEEDED", "done", 5000).ok());
  EXPECT_EQ(store_->UpdateJob("nope", "FAILED", "", 0).code(), StatusCode::kNotFound);
  auto jobs = store_->Jobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id, "j1");
  EXPECT_EQ((*jobs)[0].state, "SUCCEEDED");
  EXPECT_EQ((*jobs)[0].summary, "done");
  EXPECT_EQ((*jobs)[0].ended_wall_ns, 5000);
  EXPECT_EQ((*jobs)[1].ended_wall_ns, 0) << "a job that has not ended has no end";
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
  if (GetParam() != std::string("memory")) {
    EXPECT_EQ((*all)[1].evidence_json, "{}");
  }
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

TEST_P(EventStoreTest, KeepsGpuSeriesReplacesRepeatsAndThinsOldIntervals) {
  std::vector<GpuSampleRecord> rows;
  for (Nanos t = 0; t < 60 * kSecond; t += 10 * kSecond) {
    for (int gpu = 1; gpu >= 0; --gpu) {
      GpuSampleRecord g;
      g.job_id = "j1";
      g.node = "node0";
      g.gpu = gpu;
      g.wall_ns = t;
      g.sm_clock_mhz = 1980 - gpu;
      g.temperature_c = 60;
      g.power_mw = 650000;
      g.throttle_reasons = gpu == 1 ? 0x40 : 0;  // NVML's HW thermal slowdown
      rows.push_back(g);
    }
  }
  GpuSampleRecord other;
  other.job_id = "j2";
  other.node = "nodeX";
  other.gpu = 0;
  rows.push_back(other);
  ASSERT_TRUE(store_->AppendGpuSamples(rows).ok());
  GpuSampleRecord again = rows[0];  // t 0, GPU 1: replaced
  again.sm_clock_mhz = 1410;
  ASSERT_TRUE(store_->AppendGpuSamples({again}).ok());
  auto some = store_->GpuSamples("j1", 0, 10 * kSecond);
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 4u);
  EXPECT_EQ((*some)[0].gpu, 0);  // by time, node, GPU
  EXPECT_EQ((*some)[1].gpu, 1);
  EXPECT_EQ((*some)[1].sm_clock_mhz, 1410);
  EXPECT_EQ((*some)[1].throttle_reasons, 0x40);
  EXPECT_EQ((*some)[1].memory_clock_mhz, -1);  // unknown stays unknown
  EXPECT_EQ((*some)[1].power_mw, 650000);
  EXPECT_EQ((*some)[2].wall_ns, 10 * kSecond);

  ASSERT_TRUE(store_->CompactGpuSamples("j1", 40 * kSecond, 30 * kSecond).ok());
  auto all = store_->GpuSamples("j1", 0, 100 * kSecond);
  ASSERT_TRUE(all.ok());
  std::set<Nanos> times;
  for (const auto& g : *all) times.insert(g.wall_ns);
  EXPECT_EQ(times, (std::set<Nanos>{0, 30 * kSecond, 40 * kSecond, 50 * kSecond}));
  EXPECT_EQ(all->size(), 8u);
  EXPECT_EQ(store_->GpuSamples("j2", 0, 0)->size(), 1u);
}

// A write retried after the answer to its commit was lost (a connection
// dropped at COMMIT) comes again with the same uid: the store keeps it once,
// alone or in a batch, on any connection. Events without a uid are each new.
TEST_P(EventStoreTest, AnEventStoredUnderItsUidIsNotStoredAgain) {
  ASSERT_TRUE(store_->CreateJob({"j", 1, "c", "{}", "RUNNING", ""}).ok());
  Event a;
  a.job_id = "j";
  a.kind = "a";
  a.uid = "writer1-1";
  a.detail_json = "{}";
  Event b = a;
  b.kind = "b";
  b.uid = "writer1-2";
  Event plain = a;
  plain.kind = "plain";
  plain.uid.clear();
  ASSERT_TRUE(store_->Append(a).ok());
  ASSERT_TRUE(store_->Append(a).ok());
  ASSERT_TRUE(store_->AppendEvents({a, b}).ok());
  ASSERT_TRUE(store_->AppendEvents({a, b}).ok());
  ASSERT_TRUE(store_->Append(plain).ok());
  ASSERT_TRUE(store_->Append(plain).ok());
  EventStore* other = Another();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->AppendEvents({b}).ok());
  auto events = store_->Events("j");
  ASSERT_TRUE(events.ok());
  std::vector<std::string> kinds;
  for (const Event& e : *events) kinds.push_back(e.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"a", "b", "plain", "plain"}));
}

// The same for the other records a retry could store twice.
TEST_P(EventStoreTest, IncidentsNodeActionsAndDiagnosticsStoredUnderTheirUidAreNotStoredAgain) {
  IncidentRecord incident{"j", 1, 10, "node1", 3, "gpu_hardware", "xid-79", "evict", 40, "{}", "w-1"};
  NodeAction action{"node1", 11, "cordon", "controller of job j", "xid 79", "j", "{}", "w-2"};
  DiagnosticsRecord diag{"node1", 12, "quick", "j", "[]", "w-3"};
  for (int attempt = 0; attempt < 2; ++attempt) {
    ASSERT_TRUE(store_->RecordIncident(incident).ok());
    ASSERT_TRUE(store_->RecordNodeAction(action).ok());
    ASSERT_TRUE(store_->RecordDiagnostics(diag).ok());
  }
  action.uid.clear();  // an operator's, without a uid: each is new
  ASSERT_TRUE(store_->RecordNodeAction(action).ok());
  ASSERT_TRUE(store_->RecordNodeAction(action).ok());
  EXPECT_EQ(store_->IncidentsOnNode("node1")->size(), 1u);
  EXPECT_EQ(store_->NodeActions("node1")->size(), 3u);
  diag.wall_ns = 13;
  diag.uid = "w-4";
  ASSERT_TRUE(store_->RecordDiagnostics(diag).ok());
  auto newest = store_->LatestDiagnostics();
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 1u);
  EXPECT_EQ((*newest)[0].wall_ns, 13);
}

// The stores behind a file or a server (the memory store keeps bytes as given).
class DurableEventStoreTest : public EventStoreTest {};

TEST_P(DurableEventStoreTest, TextThatIsNotUtf8IsRepairedNotLost) {
  ASSERT_TRUE(store_->CreateJob({"j", 1, "c", "{}", "RUNNING", ""}).ok());
  Event e;
  e.job_id = "j";
  e.kind = "log_alert";
  const char raw[] = "cut \xE2\x82 in the middle, a NUL \0 and latin-1 \xE9 end";
  e.message = std::string(raw, sizeof(raw) - 1);
  ASSERT_TRUE(store_->Append(e).ok());
  auto events = store_->Events("j");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].message.substr(0, 4), "cut ");
  EXPECT_NE((*events)[0].message.find(" end"), std::string::npos);
  if (GetParam() == "postgres") {
    EXPECT_NE((*events)[0].message.find("\xEF\xBF\xBD"), std::string::npos);
  }
}

// The lead of a job: one holder at a time, renewed without a new epoch,
// taken over only once expired (or let go), with the epoch raised.
TEST_P(EventStoreTest, TheLeadOfAJobPassesOnlyWhenItsHolderLetsItExpire) {
  // A second connection, as a standby controller on another host has.
  EventStore* other = Another();
  ASSERT_NE(other, nullptr);
  auto a = store_->AcquireLease("j", "ctl-a", 60 * kSecond);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->granted);
  EXPECT_EQ(a->epoch, 1);
  EXPECT_GT(a->expires_in, 50 * kSecond);
  auto b = other->AcquireLease("j", "ctl-b", 60 * kSecond);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_FALSE(b->granted);
  EXPECT_EQ(b->holder, "ctl-a");
  EXPECT_EQ(b->epoch, 1);
  auto renewed = store_->AcquireLease("j", "ctl-a", 60 * kSecond);
  ASSERT_TRUE(renewed.ok() && renewed->granted);
  EXPECT_EQ(renewed->epoch, 1) << "a renewal keeps the epoch";
  EXPECT_TRUE(other->AcquireLease("other-job", "ctl-b", 60 * kSecond)->granted) << "leads are per job";
  // A short lead expires; then the standby takes it, and the old holder
  // cannot take it back however soon it asks.
  ASSERT_TRUE(store_->AcquireLease("j", "ctl-a", 50 * kMillisecond)->granted);
  StatusOr<JobLease> taken = JobLease{};
  testutil::WaitUntil([&] { return (taken = other->AcquireLease("j", "ctl-b", 60 * kSecond)).ok() && taken->granted; },
                      std::chrono::milliseconds(10000), std::chrono::milliseconds(5));
  ASSERT_TRUE(taken.ok() && taken->granted);
  EXPECT_EQ(taken->epoch, 2);
  auto back = store_->AcquireLease("j", "ctl-a", 60 * kSecond);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->granted);
  EXPECT_EQ(back->holder, "ctl-b");
  // Let go: the next one need not wait for it to expire.
  ASSERT_TRUE(other->ReleaseLease("j", "ctl-b").ok());
  auto again = store_->AcquireLease("j", "ctl-a", 60 * kSecond);
  ASSERT_TRUE(again.ok() && again->granted);
  EXPECT_EQ(again->epoch, 3);
}

// Every write of a fenced store checks the lead in its own transaction:
// once another holder took the job over, nothing of the old leader's is
// stored, and it can tell (FencedBy); the new leader and unfenced stores (an
// operator's cordon) write on.
TEST_P(EventStoreTest, AFencedLeaderWritesNothingOnceItsLeadPassed) {
  EventStore* other = Another();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(store_->CreateJob({"j", 1, "c", "{}", "RUNNING", ""}).ok());
  ASSERT_TRUE(store_->AcquireLease("j", "ctl-a", 50 * kMillisecond)->granted);
  store_->FenceWrites("j", 1);
  Event e;
  e.job_id = "j";
  e.kind = "state";
  e.message = "by a, leading";
  ASSERT_TRUE(store_->Append(e).ok());
  ASSERT_TRUE(store_->AppendEvents({e, e}).ok());
  EXPECT_EQ(store_->FencedBy(), 0);
  StatusOr<JobLease> taken = JobLease{};
  testutil::WaitUntil([&] { return (taken = other->AcquireLease("j", "ctl-b", 60 * kSecond)).ok() && taken->granted; },
                      std::chrono::milliseconds(10000), std::chrono::milliseconds(5));
  ASSERT_TRUE(taken.ok() && taken->granted);
  if (other != store_.get()) other->FenceWrites("j", taken->epoch);
  e.message = "by a, after the takeover";
  Status refused = store_->Append(e);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_NE(refused.message().find("passed to ctl-b (epoch 2)"), std::string::npos) << refused.message();
  EXPECT_EQ(store_->FencedBy(), 2);
  for (Status s : {store_->AppendEvents({e}), store_->UpdateJob("j", "FAILED", "a", 0),
                   store_->RecordIncident({"j", 1, 1, "n", 0, "other", "r", "restart", 1, "{}"}),
                   store_->SetNodeHealth({"n1", "cordoned", "by a", "j", 1}),
                   store_->RecordNodeAction({"n1", 1, "evict", "a", "r", "j", "{}"}),
                   store_->RecordDiagnostics({"n1", 1, "quick", "j", "[]"}),
                   store_->AppendStepTimings({{"j", 0, 0, "n", 1, 0, 1, 0, "", ""}}),
                   store_->CompactStepTimings("j", 10, 2),
                   store_->AppendGpuSamples({GpuSampleRecord{"j", "n", 0, 1}}),
                   store_->CompactGpuSamples("j", 10, 2)}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  }
  if (other != store_.get()) {
    e.message = "by b";
    ASSERT_TRUE(other->Append(e).ok());
  }
  auto events = other->Events("j");
  ASSERT_TRUE(events.ok());
  std::vector<std::string> messages;
  for (const auto& x : *events) messages.push_back(x.message);
  std::vector<std::string> expected = {"by a, leading", "by a, leading", "by a, leading"};
  if (other != store_.get()) expected.push_back("by b");
  EXPECT_EQ(messages, expected);
  EXPECT_EQ(other->Jobs()->at(0).state, "RUNNING");
  EXPECT_EQ(other->GetNodeHealth("n1")->status, "");
  EXPECT_TRUE(other->NodeActions("n1")->empty());
  EXPECT_TRUE(other->StepTimings("j", 0, 10)->empty());
  // An operator's store is not fenced: its cordon goes in.
  std::unique_ptr<EventStore> operator_owned;
  EventStore* op = other;
  if (GetParam() != "memory") {
    auto s = OpenEventStore(where_);
    ASSERT_TRUE(s.ok());
    operator_owned = std::move(s.value());
    op = operator_owned.get();
    EXPECT_TRUE(op->SetNodeHealth({"n1", "cordoned", "operator", "", 2}).ok());
    EXPECT_EQ(other->GetNodeHealth("n1")->status, "cordoned");
  }
}

// A takeover racing the old leader's writes: each write is stored exactly
// when it was accepted, and none is accepted after the first refusal.
TEST_P(EventStoreTest, WritesRacingATakeoverAreStoredExactlyWhenAccepted) {
  EventStore* other = Another();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(store_->AcquireLease("j", "ctl-a", 100 * kMillisecond)->granted);
  store_->FenceWrites("j", 1);
  std::atomic<int> accepted{0};
  std::atomic<bool> refused{false}, accepted_after_refusal{false};
  std::thread leader([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int i = 0; !refused.load() && std::chrono::steady_clock::now() < deadline; ++i) {
      Event e;
      e.job_id = "j";
      e.kind = "step";
      e.step = i;
      Status st = i % 2 ? store_->Append(e) : store_->AppendEvents({e});
      if (st.ok()) {
        ++accepted;
      } else if (st.code() == StatusCode::kFailedPrecondition) {
        refused = true;
      }
    }
    Event late;
    late.job_id = "j";
    late.kind = "late";
    if (store_->Append(late).ok()) accepted_after_refusal = true;
  });
  testutil::WaitUntil([&] { return accepted.load() >= 20; }, std::chrono::milliseconds(10000), std::chrono::milliseconds(1));
  StatusOr<JobLease> taken = JobLease{};
  testutil::WaitUntil([&] { return (taken = other->AcquireLease("j", "ctl-b", 60 * kSecond)).ok() && taken->granted; },
                      std::chrono::milliseconds(10000), std::chrono::milliseconds(1));
  leader.join();
  ASSERT_TRUE(taken.ok() && taken->granted);
  EXPECT_TRUE(refused.load());
  EXPECT_FALSE(accepted_after_refusal.load());
  auto stored = other->Events("j");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->size(), static_cast<std::size_t>(accepted.load()));
  for (std::size_t i = 0; i < stored->size(); ++i) EXPECT_EQ((*stored)[i].step, static_cast<std::int64_t>(i));
}

// Several controllers write at once, each through its own connection (or,
// for SQLite, its own handle on the file): every event is there once, in
// each job's order, and the node records end as one of the writers left them.
TEST_P(DurableEventStoreTest, ConcurrentWritersLoseNothing) {
  constexpr int kWriters = 4;
  constexpr int kEvents = 150;
  std::vector<std::unique_ptr<EventStore>> stores;
  for (int w = 0; w < kWriters; ++w) {
    auto s = OpenEventStore(where_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->CreateJob({"job" + std::to_string(w), w, "c", "{}", "RUNNING", ""}).ok());
    stores.push_back(std::move(s.value()));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      EventStore* s = stores[w].get();
      for (int i = 0; i < kEvents; ++i) {
        Event e;
        e.job_id = "job" + std::to_string(w);
        e.kind = "step";
        e.step = i;
        if (!s->Append(e).ok()) ++failures;
        if (i % 10 == 0) {
          if (!s->SetNodeHealth({"shared", "watch", "writer " + std::to_string(w), e.job_id, i}).ok()) ++failures;
          if (!s->RecordNodeAction({"shared", i, "cordon", "w" + std::to_string(w), "r", e.job_id, ""}).ok()) {
            ++failures;
          }
          if (!s->AppendStepTimings({{e.job_id, 0, 0, "n", i, 0, 1, 0, "", ""}}).ok()) ++failures;
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int w = 0; w < kWriters; ++w) {
    auto events = store_->Events("job" + std::to_string(w));
    ASSERT_TRUE(events.ok()) << events.status().ToString();
    ASSERT_EQ(events->size(), static_cast<std::size_t>(kEvents));
    for (int i = 0; i < kEvents; ++i) EXPECT_EQ((*events)[i].step, i);
    EXPECT_EQ(store_->StepTimings("job" + std::to_string(w), 0, kEvents)->size(), kEvents / 10u);
  }
  EXPECT_EQ(store_->NodeActions("shared")->size(), static_cast<std::size_t>(kWriters * kEvents / 10));
  auto health = store_->GetNodeHealth("shared");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, "watch");
  EXPECT_EQ(health->wall_ns, kEvents - 10);
}

INSTANTIATE_TEST_SUITE_P(All, EventStoreTest, testing::Values("memory", "sqlite", "postgres"));
INSTANTIATE_TEST_SUITE_P(All, DurableEventStoreTest, testing::Values("sqlite", "postgres"));

// Controllers that start at once on an empty database all get the schema.
TEST(PostgresEventStoreTest, ControllersStartingAtOnceAllGetTheSchema) {
  const std::string url = FreshDatabase();
  ASSERT_FALSE(url.empty());
  std::vector<std::thread> openers;
  std::atomic<int> opened{0};
  std::string error;
  std::mutex mu;
  for (int i = 0; i < 6; ++i) {
    openers.emplace_back([&] {
      auto s = OpenEventStore(url);
      if (s.ok()) {
        ++opened;
      } else {
        std::lock_guard<std::mutex> lock(mu);
        error = s.status().ToString();
      }
    });
  }
  for (auto& t : openers) t.join();
  EXPECT_EQ(opened.load(), 6) << error;
}

// A server restart cuts the connection; the next write reconnects and
// nothing written before or after is lost.
TEST(PostgresEventStoreTest, ARestartedServerLosesNoWrite) {
  PostgresTestServer server;
  ASSERT_TRUE(server.Start().ok());
  auto url = server.CreateDatabase("restart");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  auto s = OpenEventStore(*url);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EventStore* store = s->get();
  ASSERT_TRUE(store->CreateJob({"j", 1, "c", "{}", "RUNNING", ""}).ok());
  Event e;
  e.job_id = "j";
  e.kind = "before";
  ASSERT_TRUE(store->Append(e).ok());
  ASSERT_TRUE(server.Restart().ok());
  e.kind = "after";
  Status appended = store->Append(e);
  ASSERT_TRUE(appended.ok()) << appended.ToString();
  ASSERT_TRUE(store->AppendStepTimings({{"j", 0, 0, "n", 1, 0, 1, 0, "", ""}}).ok());
  auto events = store->Events("j");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].kind, "before");
  EXPECT_EQ((*events)[1].kind, "after");
  // A server that is gone is a clear error, not a hang.
  server.Stop();
  Status gone = store->Append(e);
  EXPECT_FALSE(gone.ok());
  EXPECT_NE(gone.message().find("postgresql://trainguard@127.0.0.1:"), std::string::npos) << gone.ToString();
}

TEST(PostgresEventStoreTest, AnUnreachableServerIsAClearErrorWithoutThePassword) {
  auto s = OpenEventStore("postgresql://ops:hunter2@127.0.0.1:1/fleet?connect_timeout=2");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("postgresql://ops@127.0.0.1:1/fleet"), std::string::npos)
      << s.status().ToString();
  EXPECT_EQ(s.status().message().find("hunter2"), std::string::npos) << s.status().ToString();
  EXPECT_EQ(StoreDisplayName("postgres://h/db?user=u&password=pw&sslmode=require"),
            "postgres://h/db?user=u&password=...&sslmode=require");
  EXPECT_EQ(StoreDisplayName("/var/lib/trainguard/store.db"), "/var/lib/trainguard/store.db");
}

// Processes that open a new store file at once (two prologs on a shared
// file, two controllers) all get it; none is refused as "locked" (seen: two
// Slurm prologs starting together).
TEST(SqliteEventStoreTest, ProcessesOpeningANewStoreAtOnceAllGetIt) {
  const std::string path = testing::TempDir() + "/at_once_" + std::to_string(getpid()) + ".db";
  int failed = 0;
  for (int round = 0; round < 50; ++round) {
    for (const char* suffix : {"", "-wal", "-shm"}) unlink((path + suffix).c_str());
    std::vector<pid_t> children;
    for (int i = 0; i < 6; ++i) {
      pid_t pid = fork();
      if (pid == 0) {
        auto s = OpenSqliteEventStore(path);
        const bool ok = s.ok() && (*s)->Append(Event{0, "j", 1, "k", "", -1, -1, -1, "m", "{}"}).ok();
        if (!ok) std::fprintf(stderr, "%s\n", s.ok() ? "append failed" : s.status().ToString().c_str());
        _exit(ok ? 0 : 1);
      }
      children.push_back(pid);
    }
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    auto s = OpenSqliteEventStore(path);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)->Events("j")->size(), 6u) << "round " << round;
  }
  EXPECT_EQ(failed, 0);
  for (const char* suffix : {"", "-wal", "-shm"}) unlink((path + suffix).c_str());
}

TEST(SqliteEventStoreTest, EventsSurviveReopen) {
  testutil::ScratchDir dir("event_store_reopen");  // the store, its -wal and -shm go with it
  const std::string path = dir / "store.db";
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
}

// A store file of an earlier version (events and incidents without a uid
// column, jobs without their end time) is opened, given the columns, and
// keeps its rows.
TEST(SqliteEventStoreTest, AStoreOfAnEarlierVersionGetsEventUids) {
  testutil::ScratchDir dir("event_store_old");
  const std::string path = dir / "store.db";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const char* old_schema =
        "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, wall_ns INTEGER NOT NULL, "
        "kind TEXT NOT NULL, node TEXT NOT NULL, rank INTEGER NOT NULL, generation INTEGER NOT NULL, "
        "step INTEGER NOT NULL, message TEXT NOT NULL, detail_json TEXT NOT NULL);"
        "INSERT INTO events(job_id, wall_ns, kind, node, rank, generation, step, message, detail_json) "
        "VALUES('j', 1, 'old', '', -1, 0, 3, 'before', '{}');"
        "CREATE TABLE incidents (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, incident INTEGER NOT "
        "NULL, wall_ns INTEGER NOT NULL, node TEXT NOT NULL, rank INTEGER NOT NULL, category TEXT NOT NULL, "
        "rule TEXT NOT NULL, action TEXT NOT NULL, failure_step INTEGER NOT NULL, detail_json TEXT NOT NULL);"
        "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, created_wall_ns INTEGER NOT NULL, command TEXT NOT NULL, "
        "config_json TEXT NOT NULL, state TEXT NOT NULL, summary TEXT NOT NULL DEFAULT '');"
        "INSERT INTO jobs VALUES('j', 1, 'train', '{}', 'FAILED', 'before end times');";
    EXPECT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto s = OpenSqliteEventStore(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Event e;
  e.job_id = "j";
  e.kind = "new";
  e.uid = "w-1";
  ASSERT_TRUE((*s)->Append(e).ok());
  ASSERT_TRUE((*s)->Append(e).ok());
  auto events = (*s)->Events("j");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].kind, "old");
  EXPECT_EQ((*events)[1].kind, "new");
  IncidentRecord incident{"j", 1, 10, "node1", 3, "gpu_hardware", "xid-79", "evict", 40, "{}", "w-2"};
  ASSERT_TRUE((*s)->RecordIncident(incident).ok());
  ASSERT_TRUE((*s)->RecordIncident(incident).ok());
  EXPECT_EQ((*s)->IncidentsOnNode("node1")->size(), 1u);
  // Its jobs have no end time (0: unknown); a job that ends now has one.
  EXPECT_EQ((*s)->Jobs()->at(0).ended_wall_ns, 0);
  ASSERT_TRUE((*s)->UpdateJob("j", "FAILED", "again", 77).ok());
  EXPECT_EQ((*s)->Jobs()->at(0).ended_wall_ns, 77);
  // Opened again: the column is there, nothing is added twice.
  s->reset();
  auto again = OpenSqliteEventStore(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->Events("j")->size(), 2u);
}

TEST(SqliteEventStoreTest, UnwritablePathIsAClearError) {
  auto s = OpenSqliteEventStore("/nonexistent-dir/x/store.db");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError);
  EXPECT_NE(s.status().message().find("/nonexistent-dir/x/store.db"), std::string::npos);
}

}  // namespace
}  // namespace trainguard
