// PostgresEventStore: incidents, node health, node actions and diagnostics
// (the class: postgres_event_store_impl.h).
#include "store/postgres_event_store_impl.h"

namespace trainguard {

using namespace postgres_store;  // NOLINT: this store's own helpers

Status PostgresEventStore::RecordIncident(const IncidentRecord& i) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("RecordIncident", [&]() -> Status {
    return Run("insert incident",
               "INSERT INTO incidents(job_id, incident, wall_ns, node, rank, category, rule, "
               "action, "
               "failure_step, detail_json, uid) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11) "
               "ON CONFLICT (uid) DO NOTHING",
               {Text(i.job_id), Int(i.incident), Int(i.wall_ns), Text(i.node), Int(i.rank),
                Text(i.category), Text(i.rule), Text(i.action), Int(i.failure_step),
                Json(i.detail_json, "{}"), Uid(i.uid)})
        .status();
  });
}

StatusOr<std::vector<IncidentRecord>> PostgresEventStore::IncidentsOnNode(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r =
      Run("read incidents",
          "SELECT job_id, incident, wall_ns, node, rank, category, rule, action, failure_step, "
          "detail_json FROM incidents WHERE $1='' OR node=$1 ORDER BY id",
          {Text(node)});
  if (!r.ok()) return r.status();
  std::vector<IncidentRecord> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.push_back({r->Str(i, 0), r->I32(i, 1), r->I64(i, 2), r->Str(i, 3), r->I32(i, 4),
                   r->Str(i, 5), r->Str(i, 6), r->Str(i, 7), r->I64(i, 8), r->Str(i, 9)});
  }
  return out;
}

Status PostgresEventStore::SetNodeHealth(const NodeHealth& h) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("SetNodeHealth", [&]() -> Status {
    return Run("write node health of " + h.node,
               "INSERT INTO node_health(node, status, reason, job_id, wall_ns) "
               "VALUES($1,$2,$3,$4,$5) "
               "ON CONFLICT(node) DO UPDATE SET status=excluded.status, reason=excluded.reason, "
               "job_id=excluded.job_id, wall_ns=excluded.wall_ns",
               {Text(h.node), Text(h.status), Text(h.reason), Text(h.job_id), Int(h.wall_ns)})
        .status();
  });
}

StatusOr<NodeHealth> PostgresEventStore::GetNodeHealth(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r =
      Run("read node health of " + node,
          "SELECT status, reason, job_id, wall_ns FROM node_health WHERE node=$1", {Text(node)});
  if (!r.ok()) return r.status();
  if (r->rows() == 0) return NodeHealth{node, "", "", "", 0};
  return NodeHealth{node, r->Str(0, 0), r->Str(0, 1), r->Str(0, 2), r->I64(0, 3)};
}

StatusOr<std::vector<NodeHealth>> PostgresEventStore::ListNodeHealth() {
  std::lock_guard<std::mutex> lock(mu_);
  // Byte order, as SQLite sorts, whatever the database's locale.
  auto r = Run(
      "read node health",
      "SELECT node, status, reason, job_id, wall_ns FROM node_health ORDER BY node COLLATE \"C\"",
      {});
  if (!r.ok()) return r.status();
  std::vector<NodeHealth> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.push_back({r->Str(i, 0), r->Str(i, 1), r->Str(i, 2), r->Str(i, 3), r->I64(i, 4)});
  }
  return out;
}

Status PostgresEventStore::RecordNodeAction(const NodeAction& a) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("RecordNodeAction", [&]() -> Status {
    return Run("insert node action on " + a.node,
               "INSERT INTO node_actions(node, wall_ns, action, \"by\", reason, job_id, "
               "evidence_json, uid) "
               "VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (uid) DO NOTHING",
               {Text(a.node), Int(a.wall_ns), Text(a.action), Text(a.by), Text(a.reason),
                Text(a.job_id), Json(a.evidence_json, "{}"), Uid(a.uid)})
        .status();
  });
}

StatusOr<std::vector<NodeAction>> PostgresEventStore::NodeActions(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r =
      Run("read node actions",
          "SELECT node, wall_ns, action, \"by\", reason, job_id, evidence_json FROM node_actions "
          "WHERE $1='' OR node=$1 ORDER BY id",
          {Text(node)});
  if (!r.ok()) return r.status();
  std::vector<NodeAction> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.push_back({r->Str(i, 0), r->I64(i, 1), r->Str(i, 2), r->Str(i, 3), r->Str(i, 4),
                   r->Str(i, 5), r->Str(i, 6)});
  }
  return out;
}

Status PostgresEventStore::RecordDiagnostics(const DiagnosticsRecord& d) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("RecordDiagnostics", [&]() -> Status {
    return Run("insert diagnostics of " + d.node,
               "INSERT INTO node_diagnostics(node, wall_ns, mode, job_id, figures_json, uid) "
               "VALUES($1,$2,$3,$4,$5,$6) ON CONFLICT (uid) DO NOTHING",
               {Text(d.node), Int(d.wall_ns), Text(d.mode), Text(d.job_id),
                Json(d.figures_json, "[]"), Uid(d.uid)})
        .status();
  });
}

StatusOr<std::vector<DiagnosticsRecord>> PostgresEventStore::LatestDiagnostics() {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = Run("read diagnostics",
               "SELECT node, wall_ns, mode, job_id, figures_json FROM node_diagnostics "
               "WHERE id IN (SELECT MAX(id) FROM node_diagnostics GROUP BY node) ORDER BY node "
               "COLLATE \"C\"",
               {});
  if (!r.ok()) return r.status();
  std::vector<DiagnosticsRecord> out;
  for (int i = 0; i < r->rows(); ++i) {
    out.push_back({r->Str(i, 0), r->I64(i, 1), r->Str(i, 2), r->Str(i, 3), r->Str(i, 4)});
  }
  return out;
}

}  // namespace trainguard
