// GatedEventStore: a fake that stands for a store in trouble, around a real
// one. While down(), every write fails with kUnavailable (a stopped
// PostgreSQL); while held(), every write waits until released (a SQLite file
// another process holds locked, a stalled server); events of a refused kind
// are refused as wrong (kInvalidArgument); after LoseAnswers(n), the next n
// writes are stored and then answered kUnavailable (a connection dropped at
// COMMIT: the write is in, its writer does not know). Reads pass through.
// For tests of what writes to a store (StoreWriter, the controller).
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "store/event_store.h"

namespace trainguard {

class GatedEventStore final : public EventStore {
 public:
  explicit GatedEventStore(EventStore* inner) : inner_(inner) {}

  void SetDown(bool down) { down_ = down; }
  void LoseAnswers(int n) { lose_answers_ = n; }
  // Appends of events of this kind fail with kInvalidArgument (set before use).
  void RefuseEventsOfKind(std::string kind) { refused_kind_ = std::move(kind); }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  // Writes tried (each attempt, including those that failed or waited).
  int attempts() const { return attempts_; }
  // The writes stored, by method name, in the order they were stored.
  std::vector<std::string> written() const {
    std::lock_guard<std::mutex> lock(mu_);
    return written_;
  }
  // Writes waiting in Hold now.
  int waiting() const { return waiting_; }

  Status CreateJob(const JobRecord& job) override { return Gate("CreateJob", [&] { return inner_->CreateJob(job); }); }
  Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                   Nanos ended_wall_ns) override {
    return Gate("UpdateJob", [&] { return inner_->UpdateJob(job_id, state, summary, ended_wall_ns); });
  }
  Status Append(const Event& event) override {
    return Gate("Append", [&] {
      if (!refused_kind_.empty() && event.kind == refused_kind_) return InvalidArgument("refused event " + event.kind);
      return inner_->Append(event);
    });
  }
  Status AppendEvents(const std::vector<Event>& events) override {
    return Gate("Append", [&] {
      for (const Event& e : events) {
        if (!refused_kind_.empty() && e.kind == refused_kind_) return InvalidArgument("refused event " + e.kind);
      }
      return inner_->AppendEvents(events);
    });
  }
  StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id, int limit) override {
    return inner_->EventsAfter(job_id, after_id, limit);
  }
  StatusOr<std::vector<JobRecord>> Jobs() override { return inner_->Jobs(); }
  Status RecordIncident(const IncidentRecord& incident) override {
    return Gate("RecordIncident", [&] { return inner_->RecordIncident(incident); });
  }
  StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& node) override {
    return inner_->IncidentsOnNode(node);
  }
  Status SetNodeHealth(const NodeHealth& health) override { return Gate("SetNodeHealth", [&] { return inner_->SetNodeHealth(health); }); }
  StatusOr<NodeHealth> GetNodeHealth(const std::string& node) override { return inner_->GetNodeHealth(node); }
  StatusOr<std::vector<NodeHealth>> ListNodeHealth() override { return inner_->ListNodeHealth(); }
  Status RecordNodeAction(const NodeAction& action) override {
    return Gate("RecordNodeAction", [&] { return inner_->RecordNodeAction(action); });
  }
  StatusOr<std::vector<NodeAction>> NodeActions(const std::string& node) override { return inner_->NodeActions(node); }
  Status RecordDiagnostics(const DiagnosticsRecord& record) override {
    return Gate("RecordDiagnostics", [&] { return inner_->RecordDiagnostics(record); });
  }
  StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() override { return inner_->LatestDiagnostics(); }
  Status AppendStepTimings(const std::vector<StepTimingRecord>& rows) override {
    return Gate("AppendStepTimings", [&] { return inner_->AppendStepTimings(rows); });
  }
  StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& job_id, std::int64_t from,
                                                      std::int64_t to) override {
    return inner_->StepTimings(job_id, from, to);
  }
  Status CompactStepTimings(const std::string& job_id, std::int64_t before_step, int keep_every) override {
    return Gate("CompactStepTimings", [&] { return inner_->CompactStepTimings(job_id, before_step, keep_every); });
  }
  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) override {
    return Gate("AppendGpuSamples", [&] { return inner_->AppendGpuSamples(rows); });
  }
  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from, Nanos to) override {
    return inner_->GpuSamples(job_id, from, to);
  }
  Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) override {
    return Gate("CompactGpuSamples", [&] { return inner_->CompactGpuSamples(job_id, before, keep_every); });
  }
  StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder, Nanos ttl) override {
    if (down_) return Unavailable("store down (test)");
    return inner_->AcquireLease(job_id, holder, ttl);
  }
  Status ReleaseLease(const std::string& job_id, const std::string& holder) override {
    return inner_->ReleaseLease(job_id, holder);
  }
  void FenceWrites(const std::string& job_id, std::int64_t epoch) override { inner_->FenceWrites(job_id, epoch); }
  std::int64_t FencedBy() const override { return inner_->FencedBy(); }

 private:
  template <typename F>
  Status Gate(const char* name, F write) {
    ++attempts_;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++waiting_;
      cv_.wait(lock, [&] { return !held_; });
      --waiting_;
    }
    if (down_) return Unavailable("store is down (GatedEventStore)");
    Status st = write();
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      written_.push_back(name);
    }
    if (st.ok() && lose_answers_ > 0) {
      --lose_answers_;
      return Unavailable("the connection dropped after the commit (GatedEventStore)");
    }
    return st;
  }

  EventStore* const inner_;
  std::atomic<bool> down_{false};
  std::atomic<int> lose_answers_{0};
  std::atomic<int> attempts_{0};
  std::atomic<int> waiting_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  std::vector<std::string> written_;
  std::string refused_kind_;
};

}  // namespace trainguard
