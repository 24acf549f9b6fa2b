// SqliteEventStore: incidents, node health, node actions and diagnostics
// (the class: sqlite_event_store_impl.h).
#include "store/sqlite_event_store_impl.h"

namespace trainguard {

using namespace sqlite_store;  // NOLINT: this store's own helpers

Status SqliteEventStore::RecordIncident(const IncidentRecord& i) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("RecordIncident", [&]() -> Status {
    Stmt s(db_,
           "INSERT INTO incidents(job_id, incident, wall_ns, node, rank, category, rule, "
           "action, failure_step, detail_json, uid) VALUES(?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(uid) "
           "DO NOTHING");
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

StatusOr<std::vector<IncidentRecord>> SqliteEventStore::IncidentsOnNode(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT job_id, incident, wall_ns, node, rank, category, rule, action, "
         "failure_step, detail_json FROM incidents WHERE ?='' OR node=? ORDER BY id");
  if (!s.ok()) return Error("prepare select incidents");
  s.Bind(1, node);
  s.Bind(2, node);
  std::vector<IncidentRecord> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    out.push_back({s.Text(0), static_cast<int>(s.Int(1)), s.Int(2), s.Text(3),
                   static_cast<int>(s.Int(4)), s.Text(5), s.Text(6), s.Text(7), s.Int(8),
                   s.Text(9)});
  }
  if (rc != SQLITE_DONE) return Error("read incidents");
  return out;
}

Status SqliteEventStore::SetNodeHealth(const NodeHealth& h) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("SetNodeHealth", [&]() -> Status {
    Stmt s(db_,
           "INSERT INTO node_health(node, status, reason, job_id, wall_ns) VALUES(?,?,?,?,?) "
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

StatusOr<NodeHealth> SqliteEventStore::GetNodeHealth(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT status, reason, job_id, wall_ns FROM node_health WHERE node=?");
  if (!s.ok()) return Error("prepare node health");
  s.Bind(1, node);
  int rc = sqlite3_step(s.get());
  if (rc == SQLITE_ROW) return NodeHealth{node, s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
  if (rc != SQLITE_DONE) return Error("read node health of " + node);
  return NodeHealth{node, "", "", "", 0};
}

StatusOr<std::vector<NodeHealth>> SqliteEventStore::ListNodeHealth() {
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

Status SqliteEventStore::RecordNodeAction(const NodeAction& a) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("RecordNodeAction", [&]() -> Status {
    Stmt s(
        db_,
        "INSERT INTO node_actions(node, wall_ns, action, by, reason, job_id, evidence_json, uid) "
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

StatusOr<std::vector<NodeAction>> SqliteEventStore::NodeActions(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT node, wall_ns, action, by, reason, job_id, evidence_json FROM node_actions "
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

Status SqliteEventStore::RecordDiagnostics(const DiagnosticsRecord& d) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("RecordDiagnostics", [&]() -> Status {
    Stmt s(db_,
           "INSERT INTO node_diagnostics(node, wall_ns, mode, job_id, figures_json, uid) "
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

StatusOr<std::vector<DiagnosticsRecord>> SqliteEventStore::LatestDiagnostics() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT node, wall_ns, mode, job_id, figures_json FROM node_diagnostics "
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

}  // namespace trainguard
