// Leadership over a store's leases (the store's own leases are tested in
// store/event_store_test.cc, on every backend).
#include "controller/leadership.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "store/event_store.h"
#include "testing/wait_until.h"

namespace trainguard {
namespace {

using namespace std::chrono_literals;

// A store of its own for each Leadership, sharing one table of leases (as
// connections to one database do).
class SharedLeases final : public EventStore {
 public:
  explicit SharedLeases(InMemoryEventStore* db) : db_(db) {}
  Status CreateJob(const JobRecord& j) override { return db_->CreateJob(j); }
  Status UpdateJob(const std::string& j, const std::string& s, const std::string& m, Nanos ended) override {
    return db_->UpdateJob(j, s, m, ended);
  }
  Status Append(const Event& e) override { return db_->Append(e); }
  Status AppendEvents(const std::vector<Event>& e) override { return db_->AppendEvents(e); }
  StatusOr<std::vector<Event>> EventsAfter(const std::string& j, std::int64_t a, int l) override {
    return db_->EventsAfter(j, a, l);
  }
  StatusOr<std::vector<JobRecord>> Jobs() override { return db_->Jobs(); }
  Status RecordIncident(const IncidentRecord& i) override { return db_->RecordIncident(i); }
  StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& n) override {
    return db_->IncidentsOnNode(n);
  }
  Status SetNodeHealth(const NodeHealth& h) override { return db_->SetNodeHealth(h); }
  StatusOr<NodeHealth> GetNodeHealth(const std::string& n) override { return db_->GetNodeHealth(n); }
  StatusOr<std::vector<NodeHealth>> ListNodeHealth() override { return db_->ListNodeHealth(); }
  Status RecordNodeAction(const NodeAction& a) override { return db_->RecordNodeAction(a); }
  StatusOr<std::vector<NodeAction>> NodeActions(const std::string& n) override { return db_->NodeActions(n); }
  Status RecordDiagnostics(const DiagnosticsRecord& r) override { return db_->RecordDiagnostics(r); }
  StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() override { return db_->LatestDiagnostics(); }
  Status AppendStepTimings(const std::vector<StepTimingRecord>& r) override { return db_->AppendStepTimings(r); }
  StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& j, std::int64_t f, std::int64_t t) override {
    return db_->StepTimings(j, f, t);
  }
  Status CompactStepTimings(const std::string& j, std::int64_t b, int k) override {
    return db_->CompactStepTimings(j, b, k);
  }
  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& r) override { return db_->AppendGpuSamples(r); }
  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& j, Nanos f, Nanos t) override {
    return db_->GpuSamples(j, f, t);
  }
  Status CompactGpuSamples(const std::string& j, Nanos b, Nanos k) override { return db_->CompactGpuSamples(j, b, k); }
  StatusOr<JobLease> AcquireLease(const std::string& j, const std::string& h, Nanos ttl) override {
    return db_->AcquireLease(j, h, ttl);
  }
  Status ReleaseLease(const std::string& j, const std::string& h) override { return db_->ReleaseLease(j, h); }
  void FenceWrites(const std::string& j, std::int64_t e) override { db_->FenceWrites(j, e); }
  std::int64_t FencedBy() const override { return db_->FencedBy(); }

 private:
  InMemoryEventStore* const db_;
};

TEST(LeadershipTest, OneLeadsTheOtherWaitsAndTakesOverWhenTheLeadIsLet) {
  InMemoryEventStore db;
  Leadership a(std::make_unique<SharedLeases>(&db), "j", "a", 60 * kSecond);
  Leadership b(std::make_unique<SharedLeases>(&db), "j", "b", 60 * kSecond);
  ASSERT_TRUE(a.WaitToLead(nullptr));
  EXPECT_EQ(a.epoch(), 1);
  // A standby waits; a cancelled wait says so.
  std::atomic<bool> cancel{false};
  std::atomic<bool> led{false};
  std::thread standby([&] { led = b.WaitToLead([&] { return cancel.load(); }); });
  EXPECT_TRUE(testutil::HoldsFor([&] { return !led.load(); }, 300ms));
  cancel = true;
  standby.join();
  EXPECT_FALSE(led.load());
  ASSERT_TRUE(db.ReleaseLease("j", "a").ok());
  ASSERT_TRUE(b.WaitToLead(nullptr));
  EXPECT_EQ(b.epoch(), 2);
}

TEST(LeadershipTest, ALeaderWhoseLeadPassedIsToldOnceAndLetsALapsedLeadGo) {
  InMemoryEventStore db;
  auto a = std::make_unique<Leadership>(std::make_unique<SharedLeases>(&db), "j", "a", 60 * kMillisecond);
  ASSERT_TRUE(a->WaitToLead(nullptr));
  // The leader is "paused": another takes the lead once it lapsed, and
  // lets it lapse in turn.
  ASSERT_TRUE(testutil::WaitUntil([&] { return db.AcquireLease("j", "b", 1 * kMillisecond)->granted; }, 10s));
  std::atomic<int> told{0};
  std::string why;
  a->KeepRenewing(nullptr, [&](const std::string& w) {
    why = w;
    ++told;
  });
  ASSERT_TRUE(testutil::WaitUntil([&] { return told.load() > 0; }, 10s));
  EXPECT_TRUE(testutil::HoldsFor([&] { return told.load() == 1; }, 100ms));
  EXPECT_TRUE(a->lost());
  EXPECT_NE(why.find("this controller's was 1"), std::string::npos) << why;
  // It did not keep the lead it was granted anew: the next one need not wait.
  EXPECT_TRUE(db.AcquireLease("j", "c", 60 * kSecond)->granted);
  a.reset();
}

TEST(LeadershipTest, AWriteFencedOffEndsTheLeadToo) {
  InMemoryEventStore db;
  Leadership a(std::make_unique<SharedLeases>(&db), "j", "a", 60 * kMillisecond);
  ASSERT_TRUE(a.WaitToLead(nullptr));
  db.FenceWrites("j", a.epoch());
  ASSERT_TRUE(testutil::WaitUntil([&] { return db.AcquireLease("j", "b", 60 * kSecond)->granted; }, 10s));
  Event e;
  e.job_id = "j";
  EXPECT_EQ(db.Append(e).code(), StatusCode::kFailedPrecondition);
  std::atomic<int> told{0};
  std::string why;
  a.KeepRenewing(&db, [&](const std::string& w) {
    why = w;
    ++told;
  });
  ASSERT_TRUE(testutil::WaitUntil([&] { return told.load() > 0; }, 10s));
  EXPECT_NE(why.find("a write was fenced off"), std::string::npos) << why;
  a.Stop();
}

}  // namespace
}  // namespace trainguard
