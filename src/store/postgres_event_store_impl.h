// PostgresEventStore: the class, declared for its files (the store opened by
// OpenPostgresEventStore, event_store.h); its methods by concern in postgres_event_store.cc,
// postgres_store_nodes.cc and postgres_store_series.cc. Private to src/store.
#pragma once

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "common/utf8.h"
#include "store/event_store.h"

namespace trainguard {
namespace postgres_store {

// A statement's parameter: text, or NULL.
using Param = std::optional<std::string>;

inline Param Text(const std::string& s) {
  std::string t = ValidUtf8(s);
  for (std::size_t at; (at = t.find('\0')) != std::string::npos;) t.replace(at, 1, "\xEF\xBF\xBD");
  return t;
}
inline Param Int(std::int64_t v) { return std::to_string(v); }
inline Param Json(const std::string& s, const char* empty) {
  return Text(s.empty() ? std::string(empty) : s);
}

// An event already stored under its uid is not stored again (Event::uid);
// without one (NULL) it never conflicts.
inline constexpr const char* kInsertEvent =
    "INSERT INTO events(job_id, wall_ns, kind, node, rank, generation, step, message, detail_json, "
    "uid) "
    "VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) ON CONFLICT (uid) DO NOTHING";

// A row's uid, or NULL.
inline Param Uid(const std::string& uid) { return uid.empty() ? Param() : Text(uid); }

inline std::vector<Param> EventParams(const Event& e) {
  return {Text(e.job_id), Int(e.wall_ns),  Text(e.kind),
          Text(e.node),   Int(e.rank),     Int(e.generation),
          Int(e.step),    Text(e.message), Json(e.detail_json, "{}"),
          Uid(e.uid)};
}

// An owned PGresult.
class Result {
 public:
  explicit Result(PGresult* r = nullptr) : r_(r) {}
  Result(Result&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Result& operator=(Result&& o) noexcept {
    if (this != &o) {
      PQclear(r_);
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  ~Result() { PQclear(r_); }
  PGresult* raw() const { return r_; }
  int rows() const { return PQntuples(r_); }
  std::string Str(int row, int col) const { return PQgetvalue(r_, row, col); }
  std::int64_t I64(int row, int col) const {
    const char* v = PQgetvalue(r_, row, col);
    std::int64_t out = 0;
    std::from_chars(v, v + std::char_traits<char>::length(v), out);
    return out;
  }
  int I32(int row, int col) const { return static_cast<int>(I64(row, col)); }
  std::int64_t affected() const {
    const char* n = PQcmdTuples(r_);
    return *n == '\0' ? 0 : std::stoll(n);
  }

 private:
  PGresult* r_;
};

// Rows of step timings per INSERT (10 parameters each; PostgreSQL takes at
// most 65535 parameters in one statement).
inline constexpr std::size_t kTimingRowsPerStatement = 500;

}  // namespace postgres_store

class PostgresEventStore final : public EventStore {
  using Param = postgres_store::Param;
  using Result = postgres_store::Result;

 public:
  PostgresEventStore(PGconn* conn, std::string name) : conn_(conn), name_(std::move(name)) {}
  ~PostgresEventStore() override { PQfinish(conn_); }

  Status Init();

  Status CreateJob(const JobRecord& job) override;

  Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                   Nanos ended_wall_ns) override;

  Status Append(const Event& e) override;

  Status AppendEvents(const std::vector<Event>& events) override;

  StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id,
                                           int limit) override;

  StatusOr<std::vector<JobRecord>> Jobs() override;

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

  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) override;

  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from,
                                                    Nanos to) override;

  Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) override;

  Status CompactStepTimings(const std::string& job_id, std::int64_t before_step,
                            int keep_every) override;

  StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder,
                                  Nanos ttl) override;

  Status ReleaseLease(const std::string& job_id, const std::string& holder) override;

  void FenceWrites(const std::string& job_id, std::int64_t epoch) override;

  std::int64_t FencedBy() const override { return fenced_by_.load(); }

 private:
  // `body` as it is when no fence is set; else in one transaction after
  // checking that the job's lead is still at the fence's epoch. The check
  // holds the lease's row (FOR SHARE): a takeover's update waits for this
  // write to commit, and a write that starts after the takeover sees the
  // new epoch. mu_ is held.
  Status Fenced(const char* what, const std::function<Status()>& body);

  static std::string Trim(std::string s);

  bool Reconnected();

  // One statement, once. mu_ is held.
  StatusOr<Result> Once(const std::string& what, const char* sql, const std::vector<Param>& params);

  // One statement; sent again on a fresh connection if the link broke
  // (within a transaction: once, the transaction is retried whole).
  StatusOr<Result> Run(const std::string& what, const char* sql, const std::vector<Param>& params);

  // `body` between BEGIN and COMMIT; all of it again on a fresh connection
  // if the link broke. Nothing of a failed body stays.
  // Inside another transaction (a fenced write's), part of it.
  Status InTransaction(const std::string& what, const std::function<Status()>& body);

  std::mutex mu_;
  PGconn* conn_;
  std::string name_;
  bool in_transaction_ = false;  // InTransaction's body runs
  std::string fence_job_;
  std::int64_t fence_epoch_ = 0;  // 0: writes are not fenced
  std::atomic<std::int64_t> fenced_by_{0};
};

}  // namespace trainguard
