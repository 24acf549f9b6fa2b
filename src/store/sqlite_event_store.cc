// SqliteEventStore: the embedded default, one file per machine (WAL mode; an
// append is durable against a crash of the controller process once Append
// returns). Several processes may share the file (busy timeout 5 s).
// This file: the schema, jobs and events, leases and fencing, opening the store;
// sqlite_store_nodes.cc: incidents, node health and actions, diagnostics;
// sqlite_store_series.cc: step timings and GPU samples.
#include "store/sqlite_event_store_impl.h"

namespace trainguard {

using namespace sqlite_store;  // NOLINT: this store's own helpers

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

}  // namespace

Status SqliteEventStore::Init() {
  std::string schema = "BEGIN IMMEDIATE;";
  schema += kSchema;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int rc = sqlite3_exec(db_, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK)
      rc = sqlite3_exec(db_, "PRAGMA synchronous=NORMAL", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db_, schema.c_str(), nullptr, nullptr, nullptr);
    // A store of an earlier version: jobs without their end time.
    if (rc == SQLITE_OK && !Stmt(db_, "SELECT ended_wall_ns FROM jobs LIMIT 0").ok()) {
      rc = sqlite3_exec(db_, "ALTER TABLE jobs ADD COLUMN ended_wall_ns INTEGER NOT NULL DEFAULT 0",
                        nullptr, nullptr, nullptr);
    }
    for (const char* table : kTablesWithUids) {
      if (rc == SQLITE_OK &&
          !Stmt(db_, ("SELECT uid FROM " + std::string(table) + " LIMIT 0").c_str()).ok()) {
        rc = sqlite3_exec(db_,
                          ("ALTER TABLE " + std::string(table) + " ADD COLUMN uid TEXT").c_str(),
                          nullptr, nullptr, nullptr);
      }
      if (rc == SQLITE_OK) {
        const std::string index = "CREATE UNIQUE INDEX IF NOT EXISTS " + std::string(table) +
                                  "_by_uid ON " + std::string(table) + "(uid)";
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

Status SqliteEventStore::CreateJob(const JobRecord& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("CreateJob", [&]() -> Status {
    Stmt s(db_,
           "INSERT INTO jobs(job_id, created_wall_ns, command, config_json, state, summary) "
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

Status SqliteEventStore::UpdateJob(const std::string& job_id, const std::string& state,
                                   const std::string& summary, Nanos ended_wall_ns) {
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

Status SqliteEventStore::Append(const Event& e) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("Append", [&]() -> Status {
    Stmt s(db_, kInsertEvent);
    if (!s.ok()) return Error("prepare insert event");
    BindEvent(&s, e);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("insert event " + e.kind);
    return Status::Ok();
  });
}

Status SqliteEventStore::AppendEvents(const std::vector<Event>& events) {
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

StatusOr<std::vector<Event>> SqliteEventStore::EventsAfter(const std::string& job_id,
                                                           std::int64_t after_id, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT id, job_id, wall_ns, kind, node, rank, generation, step, message, "
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

StatusOr<std::vector<JobRecord>> SqliteEventStore::Jobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT job_id, created_wall_ns, command, config_json, state, summary, ended_wall_ns FROM "
         "jobs "
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

StatusOr<JobLease> SqliteEventStore::AcquireLease(const std::string& job_id,
                                                  const std::string& holder, Nanos ttl) {
  std::lock_guard<std::mutex> lock(mu_);
  // The store is one host's file: its clock is that host's.
  const Nanos now = WallNow();
  Stmt s(
      db_,
      "INSERT INTO job_leases(job_id, holder, epoch, expires_ns) VALUES(?1, ?2, 1, ?3 + ?4) "
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

Status SqliteEventStore::ReleaseLease(const std::string& job_id, const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "UPDATE job_leases SET expires_ns=0 WHERE job_id=? AND holder=?");
  if (!s.ok()) return Error("prepare let the lead of job " + job_id + " go");
  s.Bind(1, job_id);
  s.Bind(2, holder);
  if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("let the lead of job " + job_id + " go");
  return Status::Ok();
}

void SqliteEventStore::FenceWrites(const std::string& job_id, std::int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  fence_job_ = job_id;
  fence_epoch_ = epoch;
  fenced_by_ = 0;
}

Nanos SqliteEventStore::WallNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status SqliteEventStore::Fenced(const char* what, const std::function<Status()>& body) {
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

Status SqliteEventStore::CheckFence(const char* what) {
  Stmt q(db_, "SELECT holder, epoch FROM job_leases WHERE job_id=?");
  if (!q.ok()) return Error("prepare read the lead of job " + fence_job_);
  q.Bind(1, fence_job_);
  const int rc = sqlite3_step(q.get());
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read the lead of job " + fence_job_);
  const std::int64_t now = rc == SQLITE_ROW ? q.Int(1) : 0;
  if (now == fence_epoch_) return Status::Ok();
  fenced_by_ = now;
  return FailedPrecondition("store " + path_ + ": " + what + ": the lead of job " + fence_job_ +
                            " at epoch " + std::to_string(fence_epoch_) + " passed to " +
                            (rc == SQLITE_ROW ? q.Text(0) : std::string("nobody")) + " (epoch " +
                            std::to_string(now) + "): this controller writes nothing more");
}

void SqliteEventStore::Rollback() {
  if (!in_fence_) (void)Exec("ROLLBACK");
}

Status SqliteEventStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return IoError("store " + path_ + ": " + msg);
  }
  return Status::Ok();
}

Status SqliteEventStore::Error(const std::string& what) {
  return IoError("store " + path_ + ": " + what + ": " + sqlite3_errmsg(db_));
}

StatusOr<std::unique_ptr<EventStore>> OpenSqliteEventStore(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
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
