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
// This file: the schema, jobs and events, leases and fencing, opening the store;
// postgres_store_nodes.cc: incidents, node health and actions, diagnostics;
// postgres_store_series.cc: step timings and GPU samples.
#include "store/postgres_event_store_impl.h"

namespace trainguard {

using namespace postgres_store;  // NOLINT: this store's own helpers

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

}  // namespace

Status PostgresEventStore::Init() {
  std::lock_guard<std::mutex> lock(mu_);
  Result r(PQexec(conn_, kSchema));
  if (PQresultStatus(r.raw()) != PGRES_COMMAND_OK) {
    std::string msg = PQerrorMessage(conn_);
    Result rollback(PQexec(conn_, "ROLLBACK"));
    return IoError("store " + name_ + ": create the schema: " + Trim(msg));
  }
  return Status::Ok();
}

Status PostgresEventStore::CreateJob(const JobRecord& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("CreateJob", [&]() -> Status {
    auto r = Run("insert job " + job.job_id,
                 "INSERT INTO jobs(job_id, created_wall_ns, command, config_json, state, summary) "
                 "VALUES($1,$2,$3,$4,$5,$6)",
                 {Text(job.job_id), Int(job.created_wall_ns), Text(job.command),
                  Text(job.config_json), Text(job.state), Text(job.summary)});
    return r.status();
  });
}

Status PostgresEventStore::UpdateJob(const std::string& job_id, const std::string& state,
                                     const std::string& summary, Nanos ended_wall_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("UpdateJob", [&]() -> Status {
    auto r = Run("update job " + job_id,
                 "UPDATE jobs SET state=$1, summary=$2, ended_wall_ns=$3 WHERE job_id=$4",
                 {Text(state), Text(summary), Int(ended_wall_ns), Text(job_id)});
    if (!r.ok()) return r.status();
    if (r->affected() == 0) return NotFound("job " + job_id + " in " + name_);
    return Status::Ok();
  });
}

Status PostgresEventStore::Append(const Event& e) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("Append", [&]() -> Status {
    return Run("insert event " + e.kind, kInsertEvent, EventParams(e)).status();
  });
}

Status PostgresEventStore::AppendEvents(const std::vector<Event>& events) {
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

StatusOr<std::vector<Event>> PostgresEventStore::EventsAfter(const std::string& job_id,
                                                             std::int64_t after_id, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r =
      Run("read events of " + job_id,
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

StatusOr<std::vector<JobRecord>> PostgresEventStore::Jobs() {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = Run("read jobs",
               "SELECT job_id, created_wall_ns, command, config_json, state, summary, "
               "ended_wall_ns FROM jobs "
               "ORDER BY created_wall_ns, seq",
               {});
  if (!r.ok()) return r.status();
  std::vector<JobRecord> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.push_back({r->Str(i, 0), r->I64(i, 1), r->Str(i, 2), r->Str(i, 3), r->Str(i, 4),
                   r->Str(i, 5), r->I64(i, 6)});
  }
  return out;
}

StatusOr<JobLease> PostgresEventStore::AcquireLease(const std::string& job_id,
                                                    const std::string& holder, Nanos ttl) {
  std::lock_guard<std::mutex> lock(mu_);
  // The server's clock: the controllers' hosts may disagree on the time.
  auto taken = Run(
      "take the lead of job " + job_id,
      "INSERT INTO job_leases(job_id, holder, epoch, expires_ns) "
      "VALUES($1, $2, 1, (extract(epoch from clock_timestamp()) * 1e9)::bigint + $3) "
      "ON CONFLICT(job_id) DO UPDATE SET "
      "epoch = CASE WHEN job_leases.holder = excluded.holder THEN job_leases.epoch "
      "ELSE job_leases.epoch + 1 END, holder = excluded.holder, expires_ns = excluded.expires_ns "
      "WHERE job_leases.holder = excluded.holder "
      "OR job_leases.expires_ns < (extract(epoch from clock_timestamp()) * 1e9)::bigint",
      {Text(job_id), Text(holder), Int(ttl)});
  if (!taken.ok()) return taken.status();
  auto now = Run(
      "read the lead of job " + job_id,
      "SELECT holder, epoch, expires_ns - (extract(epoch from clock_timestamp()) * 1e9)::bigint "
      "FROM job_leases WHERE job_id=$1",
      {Text(job_id)});
  if (!now.ok()) return now.status();
  if (now->rows() != 1)
    return Internal("store " + name_ + ": the lead of job " + job_id + " is not recorded");
  JobLease out;
  out.holder = now->Str(0, 0);
  out.epoch = now->I64(0, 1);
  out.expires_in = now->I64(0, 2);
  out.granted = out.holder == holder && out.expires_in > 0;
  return out;
}

Status PostgresEventStore::ReleaseLease(const std::string& job_id, const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  return Run("let the lead of job " + job_id + " go",
             "UPDATE job_leases SET expires_ns=0 WHERE job_id=$1 AND holder=$2",
             {Text(job_id), Text(holder)})
      .status();
}

void PostgresEventStore::FenceWrites(const std::string& job_id, std::int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  fence_job_ = job_id;
  fence_epoch_ = epoch;
  fenced_by_ = 0;
}

Status PostgresEventStore::Fenced(const char* what, const std::function<Status()>& body) {
  if (fence_epoch_ == 0) return body();
  return InTransaction(what, [&]() -> Status {
    auto lead =
        Once(std::string("read the lead of job ") + fence_job_,
             "SELECT holder, epoch FROM job_leases WHERE job_id=$1 FOR SHARE", {Text(fence_job_)});
    if (!lead.ok()) return lead.status();
    const std::int64_t now = lead->rows() == 1 ? lead->I64(0, 1) : 0;
    if (now != fence_epoch_) {
      fenced_by_ = now;
      return FailedPrecondition("store " + name_ + ": " + what + ": the lead of job " + fence_job_ +
                                " at epoch " + std::to_string(fence_epoch_) + " passed to " +
                                (lead->rows() == 1 ? lead->Str(0, 0) : std::string("nobody")) +
                                " (epoch " + std::to_string(now) +
                                "): this controller writes nothing more");
    }
    return body();
  });
}

std::string PostgresEventStore::Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool PostgresEventStore::Reconnected() {
  if (PQstatus(conn_) == CONNECTION_OK) return true;
  PQreset(conn_);
  return PQstatus(conn_) == CONNECTION_OK;
}

StatusOr<Result> PostgresEventStore::Once(const std::string& what, const char* sql,
                                          const std::vector<Param>& params) {
  std::vector<const char*> values;
  for (const Param& p : params) values.push_back(p ? p->c_str() : nullptr);
  Result r(PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr, values.data(),
                        nullptr, nullptr, 0));
  const ExecStatusType st = PQresultStatus(r.raw());
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return r;
  return IoError("store " + name_ + ": " + what + ": " + Trim(PQerrorMessage(conn_)));
}

StatusOr<Result> PostgresEventStore::Run(const std::string& what, const char* sql,
                                         const std::vector<Param>& params) {
  if (in_transaction_) return Once(what, sql, params);
  for (int attempt = 0;; ++attempt) {
    if (!Reconnected()) {
      return Unavailable("store " + name_ + ": " + what +
                         ": cannot reach the server: " + Trim(PQerrorMessage(conn_)));
    }
    auto r = Once(what, sql, params);
    if (r.ok() || attempt > 0 || PQstatus(conn_) == CONNECTION_OK) return r;
  }
}

Status PostgresEventStore::InTransaction(const std::string& what,
                                         const std::function<Status()>& body) {
  if (in_transaction_) return body();
  for (int attempt = 0;; ++attempt) {
    if (!Reconnected()) {
      return Unavailable("store " + name_ + ": " + what +
                         ": cannot reach the server: " + Trim(PQerrorMessage(conn_)));
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
