// SqliteEventStore: the embedded default, one file per machine (WAL mode; an
// append is durable against a crash of the controller process once Append
// returns). Several processes may share the file (busy timeout 5 s).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <sqlite3.h>

#include "store/event_store.h"

namespace trainguard {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY,
  created_wall_ns INTEGER NOT NULL,
  command TEXT NOT NULL,
  config_json TEXT NOT NULL,
  state TEXT NOT NULL,
  summary TEXT NOT NULL DEFAULT '',
  ended_wall_ns INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  wall_ns INTEGER NOT NULL,
  kind TEXT NOT NULL,
  node TEXT NOT NULL,
  rank INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  step INTEGER NOT NULL,
  message TEXT NOT NULL,
  detail_json TEXT NOT NULL,
  uid TEXT
);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE TABLE IF NOT EXISTS incidents (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL,
  incident INTEGER NOT NULL,
  wall_ns INTEGER NOT NULL,
  node TEXT NOT NULL,
  rank INTEGER NOT NULL,
  category TEXT NOT NULL,
  rule TEXT NOT NULL,
  action TEXT NOT NULL,
  failure_step INTEGER NOT NULL,
  detail_json TEXT NOT NULL,
  uid TEXT
);
CREATE INDEX IF NOT EXISTS incidents_by_node ON incidents(node, id);
CREATE TABLE IF NOT EXISTS node_health (
  node TEXT PRIMARY KEY,
  status TEXT NOT NULL,
  reason TEXT NOT NULL,
  job_id TEXT NOT NULL,
  wall_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS node_actions (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  node TEXT NOT NULL,
  wall_ns INTEGER NOT NULL,
  action TEXT NOT NULL,
  by TEXT NOT NULL,
  reason TEXT NOT NULL,
  job_id TEXT NOT NULL,
  evidence_json TEXT NOT NULL,
  uid TEXT
);
CREATE INDEX IF NOT EXISTS node_actions_by_node ON node_actions(node, id);
CREATE TABLE IF NOT EXISTS node_diagnostics (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  node TEXT NOT NULL,
  wall_ns INTEGER NOT NULL,
  mode TEXT NOT NULL,
  job_id TEXT NOT NULL,
  figures_json TEXT NOT NULL,
  uid TEXT
);
CREATE INDEX IF NOT EXISTS node_diagnostics_by_node ON node_diagnostics(node, id);
CREATE TABLE IF NOT EXISTS step_timings (
  job_id TEXT NOT NULL,
  generation INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  step INTEGER NOT NULL,
  node TEXT NOT NULL,
  start_us INTEGER NOT NULL,
  duration_us INTEGER NOT NULL,
  clock_error_us INTEGER NOT NULL,
  totals TEXT NOT NULL,
  intervals TEXT NOT NULL,
  PRIMARY KEY (job_id, step, generation, rank)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gpu_samples (
  job_id TEXT NOT NULL,
  wall_ns INTEGER NOT NULL,
  node TEXT NOT NULL,
  gpu INTEGER NOT NULL,
  sm_clock_mhz INTEGER NOT NULL,
  memory_clock_mhz INTEGER NOT NULL,
  temperature_c INTEGER NOT NULL,
  power_mw INTEGER NOT NULL,
  utilization_pct INTEGER NOT NULL,
  throttle_reasons INTEGER NOT NULL,
  ecc_uncorrected INTEGER NOT NULL,
  PRIMARY KEY (job_id, wall_ns, node, gpu)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_leases (
  job_id TEXT PRIMARY KEY,
  holder TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  expires_ns INTEGER NOT NULL
);
)sql";

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
constexpr const char* kTablesWithUids[] = {"events", "incidents", "node_actions", "node_diagnostics"};

// A row's uid, or NULL (NULLs never conflict).
void BindUid(Stmt* s, int at, const std::string& uid) {
  if (uid.empty()) {
    sqlite3_bind_null(s->get(), at);
  } else {
    s->Bind(at, uid);
  }
}

constexpr const char* kInsertEvent =
    "INSERT INTO events(job_id, wall_ns, kind, node, rank, generation, step, message, detail_json, uid) "
    "VALUES(?,?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO NOTHING";

void BindEvent(Stmt* s, const Event& e) {
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

}  // namespace

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
  Status Init() {
    const std::string schema = std::string("BEGIN IMMEDIATE;") + kSchema;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      int rc = sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
      if (rc == SQLITE_OK) rc = sqlite3_exec(db_, "PRAGMA synchronous=NORMAL", nullptr, nullptr, nullptr);
      if (rc == SQLITE_OK) rc = sqlite3_exec(db_, schema.c_str(), nullptr, nullptr, nullptr);
      // A store of an earlier version: jobs without their end time.
      if (rc == SQLITE_OK && !Stmt(db_, "SELECT ended_wall_ns FROM jobs LIMIT 0").ok()) {
        rc = sqlite3_exec(db_, "ALTER TABLE jobs ADD COLUMN ended_wall_ns INTEGER NOT NULL DEFAULT 0", nullptr,
                          nullptr, nullptr);
      }
      for (const char* table : kTablesWithUids) {
        if (rc == SQLITE_OK && !Stmt(db_, ("SELECT uid FROM " + std::string(table) + " LIMIT 0").c_str()).ok()) {
          rc = sqlite3_exec(db_, ("ALTER TABLE " + std::string(table) + " ADD COLUMN uid TEXT").c_str(), nullptr,
                            nullptr, nullptr);
        }
        if (rc == SQLITE_OK) {
          const std::string index = "CREATE UNIQUE INDEX IF NOT EXISTS " + std::string(table) + "_by_uid ON " +
                                    std::string(table) + "(uid)";
          rc = sqlite3_exec(db_, index.c_str(), nullptr, nullptr, nullptr);
        }
      }
      if (rc == SQLITE_OK) rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
      if (rc == SQLITE_OK) return Status::Ok();
      Status failed = Error("create the schema");
      if (!sqlite3_get_autocommit(db_)) (void)Exec("ROLLBACK");
      const bool busy = (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED;
      if (!busy || std::chrono::steady_clock::now() > deadline) return failed;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  Status CreateJob(const JobRecord& job) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("CreateJob", [&]() -> Status {
      Stmt s(db_, "INSERT INTO jobs(job_id, created_wall_ns, command, config_json, state, summary) "
                  "VALUES(?,?,?,?,?,?)");
      if (!s.ok()) return Error("prepare insert job");
      s.Bind(1, job.job_id);
      s.Bind(2, job.created_wall_ns);
      s.Bind(3, job.command);
      s.Bind(4, job.config_json);
      s.Bind(5, job.state);
      s.Bind(6, job.summary);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("insert job " + job.job_id);
      return Status::Ok();
    });
  }

  Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                   Nanos ended_wall_ns) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("UpdateJob", [&]() -> Status {
      Stmt s(db_, "UPDATE jobs SET state=?, summary=?, ended_wall_ns=? WHERE job_id=?");
      if (!s.ok()) return Error("prepare update job");
      s.Bind(1, state);
      s.Bind(2, summary);
      s.Bind(3, ended_wall_ns);
      s.Bind(4, job_id);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("update job " + job_id);
      if (sqlite3_changes(db_) == 0) return NotFound("job " + job_id + " in " + path_);
      return Status::Ok();
    });
  }

  Status Append(const Event& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("Append", [&]() -> Status {
      Stmt s(db_, kInsertEvent);
      if (!s.ok()) return Error("prepare insert event");
      BindEvent(&s, e);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("insert event " + e.kind);
      return Status::Ok();
    });
  }

  Status AppendEvents(const std::vector<Event>& events) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("AppendEvents", [&]() -> Status {
      TG_RETURN_IF_ERROR(Begin());
      Stmt s(db_, kInsertEvent);
      if (!s.ok()) {
        Rollback();
        return Error("prepare insert event");
      }
      for (const Event& e : events) {
        BindEvent(&s, e);
        if (sqlite3_step(s.get()) != SQLITE_DONE) {
          Status failed = Error("insert event " + e.kind);
          Rollback();
          return failed;
        }
        sqlite3_reset(s.get());
      }
      return Commit();
    });
  }

  StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id,
                                           int limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT id, job_id, wall_ns, kind, node, rank, generation, step, message, "
                "detail_json FROM events WHERE job_id=? AND id>? ORDER BY id LIMIT ?");
    if (!s.ok()) return Error("prepare select events");
    s.Bind(1, job_id);
    s.Bind(2, after_id);
    s.Bind(3, static_cast<std::int64_t>(limit));
    std::vector<Event> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      Event e;
      e.id = s.Int(0);
      e.job_id = s.Text(1);
      e.wall_ns = s.Int(2);
      e.kind = s.Text(3);
      e.node = s.Text(4);
      e.rank = static_cast<int>(s.Int(5));
      e.generation = s.Int(6);
      e.step = s.Int(7);
      e.message = s.Text(8);
      e.detail_json = s.Text(9);
      out.push_back(std::move(e));
    }
    if (rc != SQLITE_DONE) return Error("read events of " + job_id);
    return out;
  }

  Status RecordIncident(const IncidentRecord& i) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("RecordIncident", [&]() -> Status {
      Stmt s(db_, "INSERT INTO incidents(job_id, incident, wall_ns, node, rank, category, rule, "
                  "action, failure_step, detail_json, uid) VALUES(?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO NOTHING");
      if (!s.ok()) return Error("prepare insert incident");
      s.Bind(1, i.job_id);
      s.Bind(2, static_cast<std::int64_t>(i.incident));
      s.Bind(3, i.wall_ns);
      s.Bind(4, i.node);
      s.Bind(5, static_cast<std::int64_t>(i.rank));
      s.Bind(6, i.category);
      s.Bind(7, i.rule);
      s.Bind(8, i.action);
      s.Bind(9, i.failure_step);
      s.Bind(10, i.detail_json.empty() ? std::string("{}") : i.detail_json);
      BindUid(&s, 11, i.uid);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("insert incident");
      return Status::Ok();
    });
  }

  StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& node) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT job_id, incident, wall_ns, node, rank, category, rule, action, "
                "failure_step, detail_json FROM incidents WHERE ?='' OR node=? ORDER BY id");
    if (!s.ok()) return Error("prepare select incidents");
    s.Bind(1, node);
    s.Bind(2, node);
    std::vector<IncidentRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      out.push_back({s.Text(0), static_cast<int>(s.Int(1)), s.Int(2), s.Text(3),
                     static_cast<int>(s.Int(4)), s.Text(5), s.Text(6), s.Text(7), s.Int(8), s.Text(9)});
    }
    if (rc != SQLITE_DONE) return Error("read incidents");
    return out;
  }

  Status SetNodeHealth(const NodeHealth& h) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("SetNodeHealth", [&]() -> Status {
      Stmt s(db_, "INSERT INTO node_health(node, status, reason, job_id, wall_ns) VALUES(?,?,?,?,?) "
                  "ON CONFLICT(node) DO UPDATE SET status=excluded.status, reason=excluded.reason, "
                  "job_id=excluded.job_id, wall_ns=excluded.wall_ns");
      if (!s.ok()) return Error("prepare node health");
      s.Bind(1, h.node);
      s.Bind(2, h.status);
      s.Bind(3, h.reason);
      s.Bind(4, h.job_id);
      s.Bind(5, h.wall_ns);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("write node health of " + h.node);
      return Status::Ok();
    });
  }

  StatusOr<NodeHealth> GetNodeHealth(const std::string& node) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT status, reason, job_id, wall_ns FROM node_health WHERE node=?");
    if (!s.ok()) return Error("prepare node health");
    s.Bind(1, node);
    int rc = sqlite3_step(s.get());
    if (rc == SQLITE_ROW) return NodeHealth{node, s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
    if (rc != SQLITE_DONE) return Error("read node health of " + node);
    return NodeHealth{node, "", "", "", 0};
  }

  StatusOr<std::vector<NodeHealth>> ListNodeHealth() override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT node, status, reason, job_id, wall_ns FROM node_health ORDER BY node");
    if (!s.ok()) return Error("prepare node health");
    std::vector<NodeHealth> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4)});
    }
    if (rc != SQLITE_DONE) return Error("read node health");
    return out;
  }

  Status RecordNodeAction(const NodeAction& a) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("RecordNodeAction", [&]() -> Status {
      Stmt s(db_, "INSERT INTO node_actions(node, wall_ns, action, by, reason, job_id, evidence_json, uid) "
                  "VALUES(?,?,?,?,?,?,?,?) ON CONFLICT(uid) DO NOTHING");
      if (!s.ok()) return Error("prepare insert node action");
      s.Bind(1, a.node);
      s.Bind(2, a.wall_ns);
      s.Bind(3, a.action);
      s.Bind(4, a.by);
      s.Bind(5, a.reason);
      s.Bind(6, a.job_id);
      s.Bind(7, a.evidence_json.empty() ? std::string("{}") : a.evidence_json);
      BindUid(&s, 8, a.uid);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("insert node action on " + a.node);
      return Status::Ok();
    });
  }

  StatusOr<std::vector<NodeAction>> NodeActions(const std::string& node) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT node, wall_ns, action, by, reason, job_id, evidence_json FROM node_actions "
                "WHERE ?='' OR node=? ORDER BY id");
    if (!s.ok()) return Error("prepare select node actions");
    s.Bind(1, node);
    s.Bind(2, node);
    std::vector<NodeAction> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      out.push_back({s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4), s.Text(5), s.Text(6)});
    }
    if (rc != SQLITE_DONE) return Error("read node actions");
    return out;
  }

  Status RecordDiagnostics(const DiagnosticsRecord& d) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("RecordDiagnostics", [&]() -> Status {
      Stmt s(db_, "INSERT INTO node_diagnostics(node, wall_ns, mode, job_id, figures_json, uid) "
                  "VALUES(?,?,?,?,?,?) ON CONFLICT(uid) DO NOTHING");
      if (!s.ok()) return Error("prepare insert diagnostics");
      s.Bind(1, d.node);
      s.Bind(2, d.wall_ns);
      s.Bind(3, d.mode);
      s.Bind(4, d.job_id);
      s.Bind(5, d.figures_json.empty() ? std::string("[]") : d.figures_json);
      BindUid(&s, 6, d.uid);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("insert diagnostics of " + d.node);
      return Status::Ok();
    });
  }

  StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT node, wall_ns, mode, job_id, figures_json FROM node_diagnostics "
                "WHERE id IN (SELECT MAX(id) FROM node_diagnostics GROUP BY node) ORDER BY node");
    if (!s.ok()) return Error("prepare select diagnostics");
    std::vector<DiagnosticsRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      out.push_back({s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4)});
    }
    if (rc != SQLITE_DONE) return Error("read diagnostics");
    return out;
  }

  Status AppendStepTimings(const std::vector<StepTimingRecord>& rows) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("AppendStepTimings", [&]() -> Status {
      TG_RETURN_IF_ERROR(Begin());
      Stmt s(db_, "INSERT OR REPLACE INTO step_timings(job_id, generation, rank, step, node, start_us, "
                  "duration_us, clock_error_us, totals, intervals) VALUES(?,?,?,?,?,?,?,?,?,?)");
      if (!s.ok()) {
        Rollback();
        return Error("prepare insert step timings");
      }
      for (const StepTimingRecord& r : rows) {
        s.Bind(1, r.job_id);
        s.Bind(2, r.generation);
        s.Bind(3, static_cast<std::int64_t>(r.rank));
        s.Bind(4, r.step);
        s.Bind(5, r.node);
        s.Bind(6, r.start_us);
        s.Bind(7, r.duration_us);
        s.Bind(8, r.clock_error_us);
        s.Bind(9, r.totals);
        s.Bind(10, r.intervals);
        if (sqlite3_step(s.get()) != SQLITE_DONE) {
          Status e = Error("insert step timings");
          Rollback();
          return e;
        }
        sqlite3_reset(s.get());
      }
      return Commit();
    });
  }

  StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& job_id, std::int64_t from,
                                                      std::int64_t to) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT generation, rank, step, node, start_us, duration_us, clock_error_us, totals, "
                "intervals FROM step_timings WHERE job_id=? AND step>=? AND step<=? "
                "ORDER BY step, generation, rank");
    if (!s.ok()) return Error("prepare select step timings");
    s.Bind(1, job_id);
    s.Bind(2, from);
    s.Bind(3, to);
    std::vector<StepTimingRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      StepTimingRecord r;
      r.job_id = job_id;
      r.generation = s.Int(0);
      r.rank = static_cast<int>(s.Int(1));
      r.step = s.Int(2);
      r.node = s.Text(3);
      r.start_us = s.Int(4);
      r.duration_us = s.Int(5);
      r.clock_error_us = s.Int(6);
      r.totals = s.Text(7);
      r.intervals = s.Text(8);
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error("read step timings of " + job_id);
    return out;
  }

  Status CompactStepTimings(const std::string& job_id, std::int64_t before_step, int keep_every) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("CompactStepTimings", [&]() -> Status {
      Stmt thin(db_, "DELETE FROM step_timings WHERE job_id=? AND step<? AND step % ? != 0");
      Stmt strip(db_, "UPDATE step_timings SET intervals='' WHERE job_id=? AND step<? AND intervals!=''");
      if (!thin.ok() || !strip.ok()) return Error("prepare compact step timings");
      thin.Bind(1, job_id);
      thin.Bind(2, before_step);
      thin.Bind(3, static_cast<std::int64_t>(std::max(keep_every, 1)));
      if (sqlite3_step(thin.get()) != SQLITE_DONE) return Error("thin step timings of " + job_id);
      strip.Bind(1, job_id);
      strip.Bind(2, before_step);
      if (sqlite3_step(strip.get()) != SQLITE_DONE) return Error("strip step timings of " + job_id);
      return Status::Ok();
    });
  }

  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("AppendGpuSamples", [&]() -> Status {
      TG_RETURN_IF_ERROR(Begin());
      Stmt s(db_, "INSERT OR REPLACE INTO gpu_samples(job_id, wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, "
                  "temperature_c, power_mw, utilization_pct, throttle_reasons, ecc_uncorrected) "
                  "VALUES(?,?,?,?,?,?,?,?,?,?,?)");
      if (!s.ok()) {
        Rollback();
        return Error("prepare insert GPU samples");
      }
      for (const GpuSampleRecord& r : rows) {
        s.Bind(1, r.job_id);
        s.Bind(2, r.wall_ns);
        s.Bind(3, r.node);
        int c = 4;
        for (std::int64_t v : {static_cast<std::int64_t>(r.gpu), r.sm_clock_mhz, r.memory_clock_mhz, r.temperature_c,
                               r.power_mw, r.utilization_pct, r.throttle_reasons, r.ecc_uncorrected}) {
          s.Bind(c++, v);
        }
        if (sqlite3_step(s.get()) != SQLITE_DONE) {
          Status e = Error("insert GPU samples");
          Rollback();
          return e;
        }
        sqlite3_reset(s.get());
      }
      return Commit();
    });
  }

  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from, Nanos to) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, temperature_c, power_mw, "
                "utilization_pct, throttle_reasons, ecc_uncorrected FROM gpu_samples "
                "WHERE job_id=? AND wall_ns>=? AND wall_ns<=? ORDER BY wall_ns, node, gpu");
    if (!s.ok()) return Error("prepare select GPU samples");
    s.Bind(1, job_id);
    s.Bind(2, from);
    s.Bind(3, to);
    std::vector<GpuSampleRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      GpuSampleRecord g;
      g.job_id = job_id;
      g.wall_ns = s.Int(0);
      g.node = s.Text(1);
      g.gpu = static_cast<int>(s.Int(2));
      g.sm_clock_mhz = s.Int(3);
      g.memory_clock_mhz = s.Int(4);
      g.temperature_c = s.Int(5);
      g.power_mw = s.Int(6);
      g.utilization_pct = s.Int(7);
      g.throttle_reasons = s.Int(8);
      g.ecc_uncorrected = s.Int(9);
      out.push_back(std::move(g));
    }
    if (rc != SQLITE_DONE) return Error("read GPU samples of " + job_id);
    return out;
  }

  Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) override {
    std::lock_guard<std::mutex> lock(mu_);
    return Fenced("CompactGpuSamples", [&]() -> Status {
      Stmt thin(db_, "DELETE FROM gpu_samples WHERE job_id=? AND wall_ns<? AND wall_ns % ? != 0");
      if (!thin.ok()) return Error("prepare compact GPU samples");
      thin.Bind(1, job_id);
      thin.Bind(2, before);
      thin.Bind(3, std::max<Nanos>(keep_every, 1));
      if (sqlite3_step(thin.get()) != SQLITE_DONE) return Error("thin GPU samples of " + job_id);
      return Status::Ok();
    });
  }

  StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder, Nanos ttl) override {
    std::lock_guard<std::mutex> lock(mu_);
    // The store is one host's file: its clock is that host's.
    const Nanos now = WallNow();
    Stmt s(db_, "INSERT INTO job_leases(job_id, holder, epoch, expires_ns) VALUES(?1, ?2, 1, ?3 + ?4) "
                "ON CONFLICT(job_id) DO UPDATE SET "
                "epoch = CASE WHEN job_leases.holder = excluded.holder THEN job_leases.epoch "
                "ELSE job_leases.epoch + 1 END, holder = excluded.holder, expires_ns = excluded.expires_ns "
                "WHERE job_leases.holder = excluded.holder OR job_leases.expires_ns < ?3");
    if (!s.ok()) return Error("prepare take the lead of job " + job_id);
    s.Bind(1, job_id);
    s.Bind(2, holder);
    s.Bind(3, now);
    s.Bind(4, ttl);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("take the lead of job " + job_id);
    Stmt q(db_, "SELECT holder, epoch, expires_ns FROM job_leases WHERE job_id=?");
    if (!q.ok()) return Error("prepare read the lead of job " + job_id);
    q.Bind(1, job_id);
    if (sqlite3_step(q.get()) != SQLITE_ROW) return Error("read the lead of job " + job_id);
    JobLease out;
    out.holder = q.Text(0);
    out.epoch = q.Int(1);
    out.expires_in = q.Int(2) - now;
    out.granted = out.holder == holder && out.expires_in > 0;
    return out;
  }

  Status ReleaseLease(const std::string& job_id, const std::string& holder) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "UPDATE job_leases SET expires_ns=0 WHERE job_id=? AND holder=?");
    if (!s.ok()) return Error("prepare let the lead of job " + job_id + " go");
    s.Bind(1, job_id);
    s.Bind(2, holder);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("let the lead of job " + job_id + " go");
    return Status::Ok();
  }

  void FenceWrites(const std::string& job_id, std::int64_t epoch) override {
    std::lock_guard<std::mutex> lock(mu_);
    fence_job_ = job_id;
    fence_epoch_ = epoch;
    fenced_by_ = 0;
  }

  std::int64_t FencedBy() const override { return fenced_by_.load(); }

  StatusOr<std::vector<JobRecord>> Jobs() override {
    std::lock_guard<std::mutex> lock(mu_);
    Stmt s(db_, "SELECT job_id, created_wall_ns, command, config_json, state, summary, ended_wall_ns FROM jobs "
                "ORDER BY created_wall_ns, rowid");
    if (!s.ok()) return Error("prepare select jobs");
    std::vector<JobRecord> out;
    int rc;
    while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
      out.push_back({s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4), s.Text(5), s.Int(6)});
    }
    if (rc != SQLITE_DONE) return Error("read jobs");
    return out;
  }

 private:
  static Nanos WallNow() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  }

  // `body` as it is when no fence is set; else in one write transaction
  // (BEGIN IMMEDIATE: no other writer between the check and the write)
  // after checking that the job's lead is still at the fence's epoch.
  // mu_ is held.
  Status Fenced(const char* what, const std::function<Status()>& body) {
    if (fence_epoch_ == 0) return body();
    TG_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    in_fence_ = true;
    Status s = CheckFence(what);
    if (s.ok()) s = body();
    in_fence_ = false;
    if (!s.ok()) {
      (void)Exec("ROLLBACK");
      return s;
    }
    return Exec("COMMIT");
  }
  Status CheckFence(const char* what) {
    Stmt q(db_, "SELECT holder, epoch FROM job_leases WHERE job_id=?");
    if (!q.ok()) return Error("prepare read the lead of job " + fence_job_);
    q.Bind(1, fence_job_);
    const int rc = sqlite3_step(q.get());
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read the lead of job " + fence_job_);
    const std::int64_t now = rc == SQLITE_ROW ? q.Int(1) : 0;
    if (now == fence_epoch_) return Status::Ok();
    fenced_by_ = now;
    return FailedPrecondition("store " + path_ + ": " + what + ": the lead of job " + fence_job_ + " at epoch " +
                              std::to_string(fence_epoch_) + " passed to " +
                              (rc == SQLITE_ROW ? q.Text(0) : std::string("nobody")) + " (epoch " +
                              std::to_string(now) + "): this controller writes nothing more");
  }
  // A write's own transaction, inside a fenced one: part of it.
  Status Begin() { return in_fence_ ? Status::Ok() : Exec("BEGIN"); }
  Status Commit() { return in_fence_ ? Status::Ok() : Exec("COMMIT"); }
  void Rollback() {
    if (!in_fence_) (void)Exec("ROLLBACK");
  }

  Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      return IoError("store " + path_ + ": " + msg);
    }
    return Status::Ok();
  }
  Status Error(const std::string& what) {
    return IoError("store " + path_ + ": " + what + ": " + sqlite3_errmsg(db_));
  }

  std::mutex mu_;
  sqlite3* db_;
  std::string path_;
  std::string fence_job_;
  std::int64_t fence_epoch_ = 0;  // 0: writes are not fenced
  bool in_fence_ = false;          // a fenced write's transaction is open
  std::atomic<std::int64_t> fenced_by_{0};
};

StatusOr<std::unique_ptr<EventStore>> OpenSqliteEventStore(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return IoError("cannot open store " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteEventStore>(db, path);
  Status s = store->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<EventStore>(std::move(store));
}

}  // namespace trainguard
