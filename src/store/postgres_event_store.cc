// PostgresEventStore: the fleet store. Many controllers, on many machines,
// share one database: node health, cordons, incidents and diagnostics are
// seen by every job (docs/store.md).
//
// One connection per store, used under a mutex. A statement that fails
// because the connection broke is sent once more on a fresh connection
// (PQreset): what the controller records is not lost to a restarted server
// or a dropped link. Should the server have committed it before the link
// broke, the retry stores nothing: every row the controller writes carries
// its writer's uid, held in a unique index (ON CONFLICT (uid) DO NOTHING).
// PostgreSQL keeps text as UTF-8 without NUL bytes: such bytes are repaired
// (U+FFFD) rather than refused.
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

namespace {

// Tables as in SQLite (sqlite_event_store.cc); ids are BIGSERIAL, jobs keep
// their insertion order in `seq`. Two controllers creating the schema at once
// take turns on an advisory lock (CREATE ... IF NOT EXISTS alone races).
constexpr const char* kSchema = R"sql(
BEGIN;
SELECT pg_advisory_xact_lock(7346298104);
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY,
  seq BIGSERIAL,
  created_wall_ns BIGINT NOT NULL,
  command TEXT NOT NULL,
  config_json TEXT NOT NULL,
  state TEXT NOT NULL,
  summary TEXT NOT NULL DEFAULT ''
);
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS ended_wall_ns BIGINT NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS events (
  id BIGSERIAL PRIMARY KEY,
  job_id TEXT NOT NULL,
  wall_ns BIGINT NOT NULL,
  kind TEXT NOT NULL,
  node TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation BIGINT NOT NULL,
  step BIGINT NOT NULL,
  message TEXT NOT NULL,
  detail_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
ALTER TABLE events ADD COLUMN IF NOT EXISTS uid TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS events_by_uid ON events(uid);
-- The uids of the other rows a retry could store twice (incidents,
-- node_actions, node_diagnostics) come after their tables, below.
CREATE TABLE IF NOT EXISTS incidents (
  id BIGSERIAL PRIMARY KEY,
  job_id TEXT NOT NULL,
  incident INTEGER NOT NULL,
  wall_ns BIGINT NOT NULL,
  node TEXT NOT NULL,
  rank INTEGER NOT NULL,
  category TEXT NOT NULL,
  rule TEXT NOT NULL,
  action TEXT NOT NULL,
  failure_step BIGINT NOT NULL,
  detail_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_by_node ON incidents(node, id);
CREATE TABLE IF NOT EXISTS node_health (
  node TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  reason TEXT NOT NULL,
  job_id TEXT NOT NULL,
  wall_ns BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS node_actions (
  id BIGSERIAL PRIMARY KEY,
  node TEXT NOT NULL,
  wall_ns BIGINT NOT NULL,
  action TEXT NOT NULL,
  "by" TEXT NOT NULL,
  reason TEXT NOT NULL,
  job_id TEXT NOT NULL,
  evidence_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS node_actions_by_node ON node_actions(node, id);
CREATE TABLE IF NOT EXISTS node_diagnostics (
  id BIGSERIAL PRIMARY KEY,
  node TEXT NOT NULL,
  wall_ns BIGINT NOT NULL,
  mode TEXT NOT NULL,
  job_id TEXT NOT NULL,
  figures_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS node_diagnostics_by_node ON node_diagnostics(node, id);
CREATE TABLE IF NOT EXISTS step_timings (
  job_id TEXT NOT NULL,
  generation BIGINT NOT NULL,
  rank INTEGER NOT NULL,
  step BIGINT NOT NULL,
  node TEXT NOT NULL,
  start_us BIGINT NOT NULL,
  duration_us BIGINT NOT NULL,
  clock_error_us BIGINT NOT NULL,
  totals TEXT NOT NULL,
  intervals TEXT NOT NULL,
  PRIMARY KEY (job_id, step, generation, rank)
);
CREATE TABLE IF NOT EXISTS gpu_samples (
  job_id TEXT NOT NULL,
  wall_ns BIGINT NOT NULL,
  node TEXT NOT NULL,
  gpu INTEGER NOT NULL,
  sm_clock_mhz BIGINT NOT NULL,
  memory_clock_mhz BIGINT NOT NULL,
  temperature_c BIGINT NOT NULL,
  power_mw BIGINT NOT NULL,
  utilization_pct BIGINT NOT NULL,
  throttle_reasons BIGINT NOT NULL,
  ecc_uncorrected BIGINT NOT NULL,
  PRIMARY KEY (job_id, wall_ns, node, gpu)
);
CREATE TABLE IF NOT EXISTS job_leases (
  job_id TEXT PRIMARY KEY,
  holder TEXT NOT NULL,
  epoch BIGINT NOT NULL,
  expires_ns BIGINT NOT NULL
);
ALTER TABLE incidents ADD COLUMN IF NOT EXISTS uid TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS incidents_by_uid ON incidents(uid);
ALTER TABLE node_actions ADD COLUMN IF NOT EXISTS uid TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS node_actions_by_uid ON node_actions(uid);
ALTER TABLE node_diagnostics ADD COLUMN IF NOT EXISTS uid TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS node_diagnostics_by_uid ON node_diagnostics(uid);
COMMIT;
)sql";

// A statement's parameter: text, or NULL.
using Param = std::optional<std::string>;

Param Text(const std::string& s) {
  std::string t = ValidUtf8(s);
  for (std::size_t at; (at = t.find('\0')) != std::string::npos;) t.replace(at, 1, "\xEF\xBF\xBD");
  return t;
}
Param Int(std::int64_t v) { return std::to_string(v); }
Param Json(const std::string& s, const char* empty) { return Text(s.empty() ? std::string(empty) : s); }

// An event already stored under its uid is not stored again (Event::uid);
// without one (NULL) it never conflicts.
constexpr const char* kInsertEvent =
    "INSERT INTO events(job_id, wall_ns, kind, node, rank, generation, step, message, detail_json, uid) "
    "VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) ON CONFLICT (uid) DO NOTHING";

// A row's uid, or NULL.
Param Uid(const std::string& uid) { return uid.empty() ? Param() : Text(uid); }

std::vector<Param> EventParams(const Event& e) {
  return {Text(e.job_id), Int(e.wall_ns), Text(e.kind),    Text(e.node),
          Int(e.rank),    Int(e.generation), Int(e.step), Text(e.message),
          Json(e.detail_json, "{}"), Uid(e.uid)};
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
constexpr std::size_t kTimingRowsPerStatement = 500;

}  // namespace

class PostgresEventStore final : public EventStore {
 public:
  PostgresEventStore(PGconn* conn, std::string name) : conn_(conn), name_(std::move(name)) {}
  ~PostgresEventStore() override { PQfinish(conn_); }

  Status Init() {
    std::lock_guard<std::mutex> lock(mu_);
    Result r(PQexec(conn_, kSchema));
    if (PQresultStatus(r.raw()) != PGRES_COMMAND_OK) {
      std::string msg = PQerrorMessage(conn_);
      Result rollback(PQexec(conn_, "ROLLBACK"));
      return IoError("store " + name_ + ": create the schema: " + Trim(msg));
    }
    return Status::Ok();
  }

  Status CreateJob(const JobRecord& job) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("CreateJob", [&]() -> Status {
      auto r = Run("insert job " + job.job_id,
                   "INSERT INTO jobs(job_id, created_wall_ns, command, config_json, state, summary) "
                   "VALUES($1,$2,$3,$4,$5,$6)",
                   {Text(job.job_id), Int(job.created_wall_ns), Text(job.command), Text(job.config_json),
                    Text(job.state), Text(job.summary)});
      return r.status();
    });
  }

  Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                   Nanos ended_wall_ns) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("UpdateJob", [&]() -> Status {
      auto r = Run("update job " + job_id, "UPDATE jobs SET state=$1, summary=$2, ended_wall_ns=$3 WHERE job_id=$4",
                   {Text(state), Text(summary), Int(ended_wall_ns), Text(job_id)});
      if (!r.ok()) return r.status();
      if (r->affected() == 0) return NotFound("job " + job_id + " in " + name_);
      return Status::Ok();
    });
  }

  Status Append(const Event& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("Append", [&]() -> Status {
      return Run("insert event " + e.kind, kInsertEvent, EventParams(e)).status();
    });
  }

  Status AppendEvents(const std::vector<Event>& events) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("AppendEvents", [&]() -> Status {
      return InTransaction("insert events", [&]() -> Status {
        for (const Event& e : events) {
          // Once, not Run: inside the transaction a statement is not retried alone.
          TG_RETURN_IF_ERROR(Once("insert event " + e.kind, kInsertEvent, EventParams(e)).status());
        }
        return Status::Ok();
      });
    });
  }

  StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id, int limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read events of " + job_id,
                 "SELECT id, job_id, wall_ns, kind, node, rank, generation, step, message, detail_json "
                 "FROM events WHERE job_id=$1 AND id>$2 ORDER BY id LIMIT $3",
                 {Text(job_id), Int(after_id), limit < 0 ? Param() : Int(limit)});
    if (!r.ok()) return r.status();
    std::vector<Event> out;
    for (int i = 0; i < r->rows(); ++i) {
      Event e;
      e.id = r->I64(i, 0);
      e.job_id = r->Str(i, 1);
      e.wall_ns = r->I64(i, 2);
      e.kind = r->Str(i, 3);
      e.node = r->Str(i, 4);
      e.rank = r->I32(i, 5);
      e.generation = r->I64(i, 6);
      e.step = r->I64(i, 7);
      e.message = r->Str(i, 8);
      e.detail_json = r->Str(i, 9);
      out.push_back(std::move(e));
    }
    return out;
  }

  StatusOr<std::vector<JobRecord>> Jobs() override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read jobs",
                 "SELECT job_id, created_wall_ns, command, config_json, state, summary, ended_wall_ns FROM jobs "
                 "ORDER BY created_wall_ns, seq",
                 {});
    if (!r.ok()) return r.status();
    std::vector<JobRecord> out;
    for (int i = 0; i < r->rows(); ++i) {
      out.push_back({r->Str(i, 0), r->I64(i, 1), r->Str(i, 2), r->Str(i, 3), r->Str(i, 4), r->Str(i, 5), r->I64(i, 6)});
    }
    return out;
  }

  Status RecordIncident(const IncidentRecord& i) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("RecordIncident", [&]() -> Status {
      return Run("insert incident",
                 "INSERT INTO incidents(job_id, incident, wall_ns, node, rank, category, rule, action, "
                 "failure_step, detail_json, uid) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11) "
                 "ON CONFLICT (uid) DO NOTHING",
                 {Text(i.job_id), Int(i.incident), Int(i.wall_ns), Text(i.node), Int(i.rank), Text(i.category),
                  Text(i.rule), Text(i.action), Int(i.failure_step), Json(i.detail_json, "{}"), Uid(i.uid)})
          .status();
    });
  }

  StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& node) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read incidents",
                 "SELECT job_id, incident, wall_ns, node, rank, category, rule, action, failure_step, "
                 "detail_json FROM incidents WHERE $1='' OR node=$1 ORDER BY id",
                 {Text(node)});
    if (!r.ok()) return r.status();
    std::vector<IncidentRecord> out;
    for (int i = 0; i < r->rows(); ++i) {
      out.push_back({r->Str(i, 0), r->I32(i, 1), r->I64(i, 2), r->Str(i, 3), r->I32(i, 4), r->Str(i, 5),
                     r->Str(i, 6), r->Str(i, 7), r->I64(i, 8), r->Str(i, 9)});
    }
    return out;
  }

  Status SetNodeHealth(const NodeHealth& h) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("SetNodeHealth", [&]() -> Status {
      return Run("write node health of " + h.node,
                 "INSERT INTO node_health(node, status, reason, job_id, wall_ns) VALUES($1,$2,$3,$4,$5) "
                 "ON CONFLICT(node) DO UPDATE SET status=excluded.status, reason=excluded.reason, "
                 "job_id=excluded.job_id, wall_ns=excluded.wall_ns",
                 {Text(h.node), Text(h.status), Text(h.reason), Text(h.job_id), Int(h.wall_ns)})
          .status();
    });
  }

  StatusOr<NodeHealth> GetNodeHealth(const std::string& node) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read node health of " + node,
                 "SELECT status, reason, job_id, wall_ns FROM node_health WHERE node=$1", {Text(node)});
    if (!r.ok()) return r.status();
    if (r->rows() == 0) return NodeHealth{node, "", "", "", 0};
    return NodeHealth{node, r->Str(0, 0), r->Str(0, 1), r->Str(0, 2), r->I64(0, 3)};
  }

  StatusOr<std::vector<NodeHealth>> ListNodeHealth() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Byte order, as SQLite sorts, whatever the database's locale.
    auto r = Run("read node health",
                 "SELECT node, status, reason, job_id, wall_ns FROM node_health ORDER BY node COLLATE \"C\"", {});
    if (!r.ok()) return r.status();
    std::vector<NodeHealth> out;
    for (int i = 0; i < r->rows(); ++i) {
      out.push_back({r->Str(i, 0), r->Str(i, 1), r->Str(i, 2), r->Str(i, 3), r->I64(i, 4)});
    }
    return out;
  }

  Status RecordNodeAction(const NodeAction& a) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("RecordNodeAction", [&]() -> Status {
      return Run("insert node action on " + a.node,
                 "INSERT INTO node_actions(node, wall_ns, action, \"by\", reason, job_id, evidence_json, uid) "
                 "VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (uid) DO NOTHING",
                 {Text(a.node), Int(a.wall_ns), Text(a.action), Text(a.by), Text(a.reason), Text(a.job_id),
                  Json(a.evidence_json, "{}"), Uid(a.uid)})
          .status();
    });
  }

  StatusOr<std::vector<NodeAction>> NodeActions(const std::string& node) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read node actions",
                 "SELECT node, wall_ns, action, \"by\", reason, job_id, evidence_json FROM node_actions "
                 "WHERE $1='' OR node=$1 ORDER BY id",
                 {Text(node)});
    if (!r.ok()) return r.status();
    std::vector<NodeAction> out;
    for (int i = 0; i < r->rows(); ++i) {
      out.push_back({r->Str(i, 0), r->I64(i, 1), r->Str(i, 2), r->Str(i, 3), r->Str(i, 4), r->Str(i, 5),
                     r->Str(i, 6)});
    }
    return out;
  }

  Status RecordDiagnostics(const DiagnosticsRecord& d) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("RecordDiagnostics", [&]() -> Status {
      return Run("insert diagnostics of " + d.node,
                 "INSERT INTO node_diagnostics(node, wall_ns, mode, job_id, figures_json, uid) "
                 "VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT (uid) DO NOTHING",
                 {Text(d.node), Int(d.wall_ns), Text(d.mode), Text(d.job_id), Json(d.figures_json, "[]"),
                  Uid(d.uid)})
          .status();
    });
  }

  StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read diagnostics",
                 "SELECT node, wall_ns, mode, job_id, figures_json FROM node_diagnostics "
                 "WHERE id IN (SELECT MAX(id) FROM node_diagnostics GROUP BY node) ORDER BY node COLLATE \"C\"",
                 {});
    if (!r.ok()) return r.status();
    std::vector<DiagnosticsRecord> out;
    for (int i = 0; i < r->rows(); ++i) {
      out.push_back({r->Str(i, 0), r->I64(i, 1), r->Str(i, 2), r->Str(i, 3), r->Str(i, 4)});
    }
    return out;
  }

  Status AppendStepTimings(const std::vector<StepTimingRecord>& rows) override {
    // One statement may not touch a row twice (ON CONFLICT): a repeat in
    // the batch replaces the earlier one here, as it would in the table.
    std::map<std::tuple<std::string, std::int64_t, int, std::int64_t>, const StepTimingRecord*> unique;
    for (const StepTimingRecord& r : rows) unique[{r.job_id, r.step, r.rank, r.generation}] = &r;
    std::vector<const StepTimingRecord*> batch;
    for (const auto& [key, r] : unique) batch.push_back(r);
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("AppendStepTimings", [&]() -> Status {
      return InTransaction("insert step timings", [&]() -> Status {
        for (std::size_t from = 0; from < batch.size(); from += kTimingRowsPerStatement) {
          const std::size_t to = std::min(batch.size(), from + kTimingRowsPerStatement);
          std::string sql =
              "INSERT INTO step_timings(job_id, generation, rank, step, node, start_us, duration_us, "
              "clock_error_us, totals, intervals) VALUES";
          std::vector<Param> params;
          for (std::size_t i = from; i < to; ++i) {
            const StepTimingRecord& r = *batch[i];
            sql += i == from ? "(" : ",(";
            for (int c = 1; c <= 10; ++c) {
              sql += "$" + std::to_string(params.size() + c) + (c < 10 ? "," : ")");
            }
            for (Param p : {Text(r.job_id), Int(r.generation), Int(r.rank), Int(r.step), Text(r.node),
                            Int(r.start_us), Int(r.duration_us), Int(r.clock_error_us), Text(r.totals),
                            Text(r.intervals)}) {
              params.push_back(std::move(p));
            }
          }
          sql += " ON CONFLICT(job_id, step, generation, rank) DO UPDATE SET node=excluded.node, "
                 "start_us=excluded.start_us, duration_us=excluded.duration_us, "
                 "clock_error_us=excluded.clock_error_us, totals=excluded.totals, intervals=excluded.intervals";
          auto r = Once("insert step timings", sql.c_str(), params);
          if (!r.ok()) return r.status();
        }
        return Status::Ok();
      });
    });
  }

  StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& job_id, std::int64_t from,
                                                      std::int64_t to) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read step timings of " + job_id,
                 "SELECT generation, rank, step, node, start_us, duration_us, clock_error_us, totals, intervals "
                 "FROM step_timings WHERE job_id=$1 AND step>=$2 AND step<=$3 ORDER BY step, generation, rank",
                 {Text(job_id), Int(from), Int(to)});
    if (!r.ok()) return r.status();
    std::vector<StepTimingRecord> out;
    for (int i = 0; i < r->rows(); ++i) {
      StepTimingRecord t;
      t.job_id = job_id;
      t.generation = r->I64(i, 0);
      t.rank = r->I32(i, 1);
      t.step = r->I64(i, 2);
      t.node = r->Str(i, 3);
      t.start_us = r->I64(i, 4);
      t.duration_us = r->I64(i, 5);
      t.clock_error_us = r->I64(i, 6);
      t.totals = r->Str(i, 7);
      t.intervals = r->Str(i, 8);
      out.push_back(std::move(t));
    }
    return out;
  }

  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) override {
    std::map<std::tuple<std::string, Nanos, std::string, int>, const GpuSampleRecord*> unique;
    for (const GpuSampleRecord& r : rows) unique[{r.job_id, r.wall_ns, r.node, r.gpu}] = &r;
    std::vector<const GpuSampleRecord*> batch;
    for (const auto& [key, r] : unique) batch.push_back(r);
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("AppendGpuSamples", [&]() -> Status {
      return InTransaction("insert GPU samples", [&]() -> Status {
        for (std::size_t from = 0; from < batch.size(); from += kTimingRowsPerStatement) {
          const std::size_t to = std::min(batch.size(), from + kTimingRowsPerStatement);
          std::string sql =
              "INSERT INTO gpu_samples(job_id, wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, temperature_c, "
              "power_mw, utilization_pct, throttle_reasons, ecc_uncorrected) VALUES";
          std::vector<Param> params;
          for (std::size_t i = from; i < to; ++i) {
            const GpuSampleRecord& r = *batch[i];
            sql += i == from ? "(" : ",(";
            for (int c = 1; c <= 11; ++c) sql += "$" + std::to_string(params.size() + c) + (c < 11 ? "," : ")");
            for (Param p : {Text(r.job_id), Int(r.wall_ns), Text(r.node), Int(r.gpu), Int(r.sm_clock_mhz),
                            Int(r.memory_clock_mhz), Int(r.temperature_c), Int(r.power_mw), Int(r.utilization_pct),
                            Int(r.throttle_reasons), Int(r.ecc_uncorrected)}) {
              params.push_back(std::move(p));
            }
          }
          sql += " ON CONFLICT(job_id, wall_ns, node, gpu) DO UPDATE SET sm_clock_mhz=excluded.sm_clock_mhz, "
                 "memory_clock_mhz=excluded.memory_clock_mhz, temperature_c=excluded.temperature_c, "
                 "power_mw=excluded.power_mw, utilization_pct=excluded.utilization_pct, "
                 "throttle_reasons=excluded.throttle_reasons, ecc_uncorrected=excluded.ecc_uncorrected";
          auto r = Once("insert GPU samples", sql.c_str(), params);
          if (!r.ok()) return r.status();
        }
        return Status::Ok();
      });
    });
  }

  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from, Nanos to) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto r = Run("read GPU samples of " + job_id,
                 "SELECT wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, temperature_c, power_mw, "
                 "utilization_pct, throttle_reasons, ecc_uncorrected FROM gpu_samples "
                 "WHERE job_id=$1 AND wall_ns>=$2 AND wall_ns<=$3 ORDER BY wall_ns, node, gpu",
                 {Text(job_id), Int(from), Int(to)});
    if (!r.ok()) return r.status();
    std::vector<GpuSampleRecord> out;
    for (int i = 0; i < r->rows(); ++i) {
      GpuSampleRecord g;
      g.job_id = job_id;
      g.wall_ns = r->I64(i, 0);
      g.node = r->Str(i, 1);
      g.gpu = r->I32(i, 2);
      g.sm_clock_mhz = r->I64(i, 3);
      g.memory_clock_mhz = r->I64(i, 4);
      g.temperature_c = r->I64(i, 5);
      g.power_mw = r->I64(i, 6);
      g.utilization_pct = r->I64(i, 7);
      g.throttle_reasons = r->I64(i, 8);
      g.ecc_uncorrected = r->I64(i, 9);
      out.push_back(std::move(g));
    }
    return out;
  }

  Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("CompactGpuSamples", [&]() -> Status {
      return Once("thin GPU samples of " + job_id,
                  "DELETE FROM gpu_samples WHERE job_id=$1 AND wall_ns<$2 AND wall_ns % $3 != 0",
                  {Text(job_id), Int(before), Int(std::max<Nanos>(keep_every, 1))})
          .status();
    });
  }

  Status CompactStepTimings(const std::string& job_id, std::int64_t before_step, int keep_every) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("CompactStepTimings", [&]() -> Status {
      return InTransaction("compact step timings of " + job_id, [&]() -> Status {
        auto thin = Once("thin step timings of " + job_id,
                         "DELETE FROM step_timings WHERE job_id=$1 AND step<$2 AND step % $3 != 0",
                         {Text(job_id), Int(before_step), Int(std::max(keep_every, 1))});
        if (!thin.ok()) return thin.status();
        return Once("strip step timings of " + job_id,
                    "UPDATE step_timings SET intervals='' WHERE job_id=$1 AND step<$2 AND intervals!=''",
                    {Text(job_id), Int(before_step)})
            .status();
      });
    });
  }

  StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder, Nanos ttl) override {
    std::lock_guard<std::mutex> lock(mu_);
    // The server's clock: the controllers' hosts may disagree on the time.
    auto taken = Run("take the lead of job " + job_id,
                     "INSERT INTO job_leases(job_id, holder, epoch, expires_ns) "
                     "VALUES($1, $2, 1, (extract(epoch from clock_timestamp()) * 1e9)::bigint + $3) "
                     "ON CONFLICT(job_id) DO UPDATE SET "
                     "epoch = CASE WHEN job_leases.holder = excluded.holder THEN job_leases.epoch "
                     "ELSE job_leases.epoch + 1 END, holder = excluded.holder, expires_ns = excluded.expires_ns "
                     "WHERE job_leases.holder = excluded.holder "
                     "OR job_leases.expires_ns < (extract(epoch from clock_timestamp()) * 1e9)::bigint",
                     {Text(job_id), Text(holder), Int(ttl)});
    if (!taken.ok()) return taken.status();
    auto now = Run("read the lead of job " + job_id,
                   "SELECT holder, epoch, expires_ns - (extract(epoch from clock_timestamp()) * 1e9)::bigint "
                   "FROM job_leases WHERE job_id=$1",
                   {Text(job_id)});
    if (!now.ok()) return now.status();
    if (now->rows() != 1) return Internal("store " + name_ + ": the lead of job " + job_id + " is not recorded");
    JobLease out;
    out.holder = now->Str(0, 0);
    out.epoch = now->I64(0, 1);
    out.expires_in = now->I64(0, 2);
    out.granted = out.holder == holder && out.expires_in > 0;
    return out;
  }

  Status ReleaseLease(const std::string& job_id, const std::string& holder) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Run("let the lead of job " + job_id + " go",
               "UPDATE job_leases SET expires_ns=0 WHERE job_id=$1 AND holder=$2", {Text(job_id), Text(holder)})
        .status();
  }

  void FenceWrites(const std::string& job_id, std::int64_t epoch) override {
    std::lock_guard<std::mutex> lock(mu_);
    fence_job_ = job_id;
    fence_epoch_ = epoch;
    fenced_by_ = 0;
  }

  std::int64_t FencedBy() const override { return fenced_by_.load(); }

 private:
  // `body` as it is when no fence is set; else in one transaction after
  // checking that the job's lead is still at the fence's epoch. The check
  // holds the lease's row (FOR SHARE): a takeover's update waits for this
  // write to commit, and a write that starts after the takeover sees the
  // new epoch. mu_ is held.
  Status Fenced(const char* what, const std::function<Status()>& body) {
    if (fence_epoch_ == 0) return body();
    return InTransaction(what, [&]() -> Status {
      auto lead = Once(std::string("read the lead of job ") + fence_job_,
                       "SELECT holder, epoch FROM job_leases WHERE job_id=$1 FOR SHARE", {Text(fence_job_)});
      if (!lead.ok()) return lead.status();
      const std::int64_t now = lead->rows() == 1 ? lead->I64(0, 1) : 0;
      if (now != fence_epoch_) {
        fenced_by_ = now;
        return FailedPrecondition("store " + name_ + ": " + what + ": the lead of job " + fence_job_ +
                                  " at epoch " + std::to_string(fence_epoch_) + " passed to " +
                                  (lead->rows() == 1 ? lead->Str(0, 0) : std::string("nobody")) + " (epoch " +
                                  std::to_string(now) + "): this controller writes nothing more");
      }
      return body();
    });
  }

  static std::string Trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }

  bool Reconnected() {
    if (PQstatus(conn_) == CONNECTION_OK) return true;
    PQreset(conn_);
    return PQstatus(conn_) == CONNECTION_OK;
  }

  // One statement, once. mu_ is held.
  StatusOr<Result> Once(const std::string& what, const char* sql, const std::vector<Param>& params) {
    std::vector<const char*> values;
    for (const Param& p : params) values.push_back(p ? p->c_str() : nullptr);
    Result r(PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr,
                          0));
    const ExecStatusType st = PQresultStatus(r.raw());
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
    return IoError("store " + name_ + ": " + what + ": " + Trim(PQerrorMessage(conn_)));
  }

  // One statement; sent again on a fresh connection if the link broke
  // (within a transaction: once, the transaction is retried whole).
  StatusOr<Result> Run(const std::string& what, const char* sql, const std::vector<Param>& params) {
    if (in_transaction_) return Once(what, sql, params);
    for (int attempt = 0;; ++attempt) {
      if (!Reconnected()) {
        return Unavailable("store " + name_ + ": " + what + ": cannot reach the server: " +
                           Trim(PQerrorMessage(conn_)));
      }
      auto r = Once(what, sql, params);
      if (r.ok() || attempt > 0 || PQstatus(conn_) == CONNECTION_OK) return r;
    }
  }

  // `body` between BEGIN and COMMIT; all of it again on a fresh connection
  // if the link broke. Nothing of a failed body stays.
  // Inside another transaction (a fenced write's), part of it.
  Status InTransaction(const std::string& what, const std::function<Status()>& body) {
    if (in_transaction_) return body();
    for (int attempt = 0;; ++attempt) {
      if (!Reconnected()) {
        return Unavailable("store " + name_ + ": " + what + ": cannot reach the server: " +
                           Trim(PQerrorMessage(conn_)));
      }
      Status s = Once(what, "BEGIN", {}).status();
      if (s.ok()) {
        in_transaction_ = true;
        s = body();
        in_transaction_ = false;
      }
      if (s.ok()) s = Once(what, "COMMIT", {}).status();
      if (s.ok()) return s;
      if (PQstatus(conn_) == CONNECTION_OK) {
        Result rollback(PQexec(conn_, "ROLLBACK"));
        return s;
      }
      if (attempt > 0) return s;
    }
  }

  std::mutex mu_;
  PGconn* conn_;
  std::string name_;
  bool in_transaction_ = false;    // InTransaction's body runs
  std::string fence_job_;
  std::int64_t fence_epoch_ = 0;   // 0: writes are not fenced
  std::atomic<std::int64_t> fenced_by_{0};
};

bool IsPostgresUrl(const std::string& where) {
  return where.rfind("postgresql://", 0) == 0 || where.rfind("postgres://", 0) == 0;
}

std::string StoreDisplayName(const std::string& where) {
  if (!IsPostgresUrl(where)) return where;
  // postgresql://user:secret@host/db?password=secret -> postgresql://user@host/db
  std::string out = where;
  const std::size_t scheme = out.find("://") + 3;
  const std::size_t at = out.find('@', scheme);
  const std::size_t slash = out.find('/', scheme);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
    const std::size_t colon = out.find(':', scheme);
    if (colon != std::string::npos && colon < at) out.erase(colon, at - colon);
  }
  for (std::size_t p = 0; (p = out.find("password=", p)) != std::string::npos; p += 12) {
    const std::size_t end = out.find('&', p);
    out.replace(p + 9, (end == std::string::npos ? out.size() : end) - (p + 9), "...");
  }
  return out;
}

StatusOr<std::unique_ptr<EventStore>> OpenPostgresEventStore(const std::string& url) {
  const std::string name = StoreDisplayName(url);
  // The URL's own settings win over these defaults (they come later).
  const char* keys[] = {"connect_timeout", "application_name", "options", "dbname", nullptr};
  // A session idle inside a transaction for 2 s is ended by the server: a
  // leader paused (or cut off) in the middle of a fenced write holds the
  // lead's row (FOR SHARE), and its standby must not wait on it for long
  // (docs/standby.md). The store's transactions run statement after
  // statement; none is idle for that long.
  const char* values[] = {"10", "trainguard",
                          "-c statement_timeout=30000 -c client_min_messages=warning "
                          "-c idle_in_transaction_session_timeout=2000",
                          url.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keys, values, 1);
  if (conn == nullptr) return IoError("cannot open store " + name + ": out of memory");
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(conn);
    PQfinish(conn);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    return Unavailable("cannot open store " + name + ": " + msg);
  }
  auto store = std::make_unique<PostgresEventStore>(conn, name);
  TG_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<EventStore>(std::move(store));
}

}  // namespace trainguard
