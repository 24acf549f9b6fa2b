// SqliteEventStore: the class, declared for its files (the store opened by
// OpenSqliteEventStore, event_store.h); its methods by concern in sqlite_event_store.cc,
// sqlite_store_nodes.cc and sqlite_store_series.cc. Private to src/store.
#pragma once

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "store/event_store.h"

namespace trainguard {
namespace sqlite_store {

// RAII prepared statement.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, std::int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  std::string Text(int i) {
    const unsigned char* t = sqlite3_column_text(stmt_, i);
    // As many bytes as were stored: a NUL inside the text does not end it.
    return t == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(t),
                                      static_cast<std::size_t>(sqlite3_column_bytes(stmt_, i)));
  }
  std::int64_t Int(int i) { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// The tables whose rows carry their writer's uid (Event::uid).
inline constexpr const char* kTablesWithUids[] = {"events", "incidents", "node_actions",
                                                  "node_diagnostics"};

// A row's uid, or NULL (NULLs never conflict).
inline void BindUid(Stmt* s, int at, const std::string& uid) {
  if (uid.empty()) {
    sqlite3_bind_null(s->get(), at);
  } else {
    s->Bind(at, uid);
  }
}

inline constexpr const char* kInsertEvent =
    "INSERT INTO events(job_id, wall_ns, kind, node, rank, generation, step, message, detail_json, "
    "uid) "
    "VALUES(?,?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO NOTHING";

inline void BindEvent(Stmt* s, const Event& e) {
  s->Bind(1, e.job_id);
  s->Bind(2, e.wall_ns);
  s->Bind(3, e.kind);
  s->Bind(4, e.node);
  s->Bind(5, static_cast<std::int64_t>(e.rank));
  s->Bind(6, e.generation);
  s->Bind(7, e.step);
  s->Bind(8, e.message);
  s->Bind(9, e.detail_json.empty() ? std::string("{}") : e.detail_json);
  BindUid(s, 10, e.uid);
}

}  // namespace sqlite_store

class SqliteEventStore final : public EventStore {
 public:
  SqliteEventStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  ~SqliteEventStore() override { sqlite3_close_v2(db_); }

  // Processes that open a new file at once (two prologs on a shared store,
  // two controllers) all get it: the schema is written under the write lock
  // taken up front (BEGIN IMMEDIATE waits through the busy handler), and a
  // "locked" that SQLite answers without waiting (switching to WAL, a lock
  // it cannot upgrade) is tried again, for at most 10 s.
  // A store of an earlier version gets what this one adds (the uid columns
  // and their unique indexes), in the same transaction.
  Status Init();

  Status CreateJob(const JobRecord& job) override;

  Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                   Nanos ended_wall_ns) override;

  Status Append(const Event& e) override;

  Status AppendEvents(const std::vector<Event>& events) override;

  StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id,
                                           int limit) override;

  Status RecordIncident(const IncidentRecord& i) override;

  StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& node) override;

  Status SetNodeHealth(const NodeHealth& h) override;

  StatusOr<NodeHealth> GetNodeHealth(const std::string& node) override;

  StatusOr<std::vector<NodeHealth>> ListNodeHealth() override;

  Status RecordNodeAction(const NodeAction& a) override;

  StatusOr<std::vector<NodeAction>> NodeActions(const std::string& node) override;

  Status RecordDiagnostics(const DiagnosticsRecord& d) override;

  StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() override;

  Status AppendStepTimings(const std::vector<StepTimingRecord>& rows) override;

  StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& job_id, std::int64_t from,
                                                      std::int64_t to) override;

  Status CompactStepTimings(const std::string& job_id, std::int64_t before_step,
                            int keep_every) override;

  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) override;

  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from,
                                                    Nanos to) override;

  Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) override;

  StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder,
                                  Nanos ttl) override;

  Status ReleaseLease(const std::string& job_id, const std::string& holder) override;

  void FenceWrites(const std::string& job_id, std::int64_t epoch) override;

  std::int64_t FencedBy() const override { return fenced_by_.load(); }

  StatusOr<std::vector<JobRecord>> Jobs() override;

 private:
  static Nanos WallNow();

  // `body` as it is when no fence is set; else in one write transaction
  // (BEGIN IMMEDIATE: no other writer between the check and the write)
  // after checking that the job's lead is still at the fence's epoch.
  // mu_ is held.
  Status Fenced(const char* what, const std::function<Status()>& body);
  Status CheckFence(const char* what);
  // A write's own transaction, inside a fenced one: part of it.
  Status Begin() { return in_fence_ ? Status::Ok() : Exec("BEGIN"); }
  Status Commit() { return in_fence_ ? Status::Ok() : Exec("COMMIT"); }
  void Rollback();

  Status Exec(const char* sql);
  Status Error(const std::string& what);

  std::mutex mu_;
  sqlite3* db_;
  std::string path_;
  std::string fence_job_;
  std::int64_t fence_epoch_ = 0;  // 0: writes are not fenced
  bool in_fence_ = false;         // a fenced write's transaction is open
  std::atomic<std::int64_t> fenced_by_{0};
};

}  // namespace trainguard
