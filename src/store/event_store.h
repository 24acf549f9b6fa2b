// EventStore: the durable record of jobs and their events.
//
// The controller appends every state change, failure and recovery step here
// as it happens; `trainguard events` and the downtime accounting read it back.
// Implementations: SqliteEventStore (the embedded default, one file; WAL mode:
// an append is durable against a crash of the controller process once Append
// returns), PostgresEventStore (the fleet store that many controllers share;
// docs/store.md) and InMemoryEventStore (tests, simulator). Thread safety: all
// methods may be called concurrently, from several processes too.
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "trainguard/status.h"

namespace trainguard {

struct JobRecord {
  std::string job_id;
  Nanos created_wall_ns = 0;
  std::string command;       // shell-quoted argv
  std::string config_json;   // nnodes, nproc_per_node, timeouts, ...
  std::string state;         // STARTING, RUNNING, RECOVERING, SUCCEEDED, FAILED
  std::string summary;       // final one-paragraph summary, if any
  Nanos ended_wall_ns = 0;   // when it SUCCEEDED or FAILED; 0 while it has not ended
};

struct Event {
  std::int64_t id = 0;       // assigned by the store, increasing per store
  std::string job_id;
  Nanos wall_ns = 0;
  std::string kind;          // see docs/events.md
  std::string node;          // "" when not about one node
  int rank = -1;             // global rank, -1 when not about one rank
  std::int64_t generation = -1;
  std::int64_t step = -1;
  std::string message;       // one human-readable line
  std::string detail_json;   // structured evidence, a JSON object ("{}" if none)
  // The writer's own name for the event, unique in the store ("" for none;
  // not read back): an append of an event whose uid the store holds already
  // stores nothing and succeeds. So a write retried after a commit whose
  // answer was lost (a connection dropped at COMMIT) is stored once.
  std::string uid{};
};

// One attributed incident, kept across jobs for the history checks.
struct IncidentRecord {
  std::string job_id;
  int incident = 0;
  Nanos wall_ns = 0;
  std::string node;          // culprit node, "" if unknown
  int rank = -1;             // culprit rank, -1 if unknown
  std::string category;
  std::string rule;
  std::string action;        // the decision taken
  std::int64_t failure_step = -1;
  std::string detail_json;
  std::string uid{};  // as Event::uid: a retried write is stored once
};

// What is known about a node across jobs.
struct NodeHealth {
  std::string node;
  // "cordoned": gets no ranks in any job until uncordoned (an operator's
  // `trainguard cordon`, or a controller's eviction); "suspect": marked by
  // stores before cordoning existed, only warned about; "watch": a warning
  // was seen; "ok": cleared by an operator.
  std::string status;
  std::string reason;
  std::string job_id;        // the job that marked it
  Nanos wall_ns = 0;
};

// A decision about a node, kept as its history: who or what took it and why.
struct NodeAction {
  std::string node;
  Nanos wall_ns = 0;
  std::string action;         // "cordon", "uncordon", "evict"
  std::string by;             // "operator root@host1", "controller of job J"
  std::string reason;
  std::string job_id;         // "" when not in a job
  std::string evidence_json;  // a JSON object ("{}" if none): figures, attribution
  std::string uid{};          // as Event::uid: a retried write is stored once
};

// One run of the diagnostics suite on one node (`trainguard diag`, or an
// agent on the controller's order). The figures are kept as the suite wrote
// them; judging them against the other nodes is the reader's (diag/judge.h).
struct DiagnosticsRecord {
  std::string node;
  Nanos wall_ns = 0;
  std::string mode;          // "quick" or "full"
  std::string job_id;        // the job that ordered it, "" when an operator ran it
  std::string figures_json;  // [{"name": ..., "value": ..., "error": ...}, ...]
  std::string uid{};         // as Event::uid: a retried write is stored once
};

// One rank's timings of one step (docs/telemetry.md). Written by the
// controller as the agents send them; read by the heatmap and the trace.
struct StepTimingRecord {
  std::string job_id;
  std::int64_t generation = 0;
  int rank = -1;
  std::string node;
  std::int64_t step = 0;
  std::int64_t start_us = 0;        // the controller's clock (the node's offset removed)
  std::int64_t duration_us = 0;
  std::int64_t clock_error_us = 0;  // how far start_us may be off (half the best round trip)
  std::string totals;               // per phase: "forward=1200;gpu:forward=900;comm:all_reduce=300" (µs)
  std::string intervals;            // every interval (docs/telemetry.md); "" once downsampled
};

// One GPU's health over one interval of the series (the controller keeps
// one row per GPU per `--gpu-series-interval`, docs/telemetry.md): the
// latest figures of the interval, its lowest SM clock and every throttle
// reason seen in it. -1: unknown.
struct GpuSampleRecord {
  std::string job_id;
  std::string node;
  int gpu = -1;
  Nanos wall_ns = 0;  // the interval's start
  std::int64_t sm_clock_mhz = -1;  // the lowest of the interval
  std::int64_t memory_clock_mhz = -1;
  std::int64_t temperature_c = -1;
  std::int64_t power_mw = -1;
  std::int64_t utilization_pct = -1;
  std::int64_t throttle_reasons = 0;  // NVML's bits, every one seen in the interval
  std::int64_t ecc_uncorrected = -1;
};

// Who leads a job (its controller; standby controllers wait for the lead),
// as AcquireLease found it. `epoch` is the fencing token: raised by one at
// every change of holder, never by a renewal.
struct JobLease {
  bool granted = false;    // the caller holds it now
  std::string holder;      // who holds it ("" if nobody ever did)
  std::int64_t epoch = 0;
  Nanos expires_in = 0;    // from now, on the store's clock (<= 0: expired)
};

class EventStore {
 public:
  virtual ~EventStore() = default;
  virtual Status CreateJob(const JobRecord& job) = 0;
  // `ended_wall_ns`: when the job ended (SUCCEEDED, FAILED); 0 otherwise.
  virtual Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                           Nanos ended_wall_ns) = 0;
  // An event whose uid the store holds already is not stored again (Event::uid).
  virtual Status Append(const Event& event) = 0;
  // Appends every event, in order, or none of them (one transaction): the
  // store writer's batches (a restart at 12,500 nodes records 12,500
  // events; one commit each made the writer the bottleneck).
  virtual Status AppendEvents(const std::vector<Event>& events) = 0;
  // Events of one job in the order appended.
  StatusOr<std::vector<Event>> Events(const std::string& job_id) { return EventsAfter(job_id, 0, -1); }
  // Those of its events whose id is above `after_id`, oldest first, at most
  // `limit` of them (-1: all): the API's pages and live stream.
  virtual StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id,
                                                   int limit) = 0;
  // All jobs, oldest first.
  virtual StatusOr<std::vector<JobRecord>> Jobs() = 0;

  virtual Status RecordIncident(const IncidentRecord& incident) = 0;
  // Incidents whose culprit is `node` ("" = any), of every job, oldest first.
  virtual StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& node) = 0;
  virtual Status SetNodeHealth(const NodeHealth& health) = 0;
  // The node's record; status "" if none.
  virtual StatusOr<NodeHealth> GetNodeHealth(const std::string& node) = 0;
  // Every node's record, by node id.
  virtual StatusOr<std::vector<NodeHealth>> ListNodeHealth() = 0;

  virtual Status RecordNodeAction(const NodeAction& action) = 0;
  // Actions on `node` ("" = every node), oldest first.
  virtual StatusOr<std::vector<NodeAction>> NodeActions(const std::string& node) = 0;

  virtual Status RecordDiagnostics(const DiagnosticsRecord& record) = 0;
  // The newest record of each node, by node id.
  virtual StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() = 0;

  // Step timings. A row for the same job, generation, rank and step replaces
  // the old one. Appended in one transaction.
  virtual Status AppendStepTimings(const std::vector<StepTimingRecord>& rows) = 0;
  // The job's rows with from <= step <= to, by step, then generation, then rank.
  virtual StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& job_id, std::int64_t from,
                                                              std::int64_t to) = 0;
  // Retention: rows of steps before `before_step` lose their intervals (the
  // totals stay), and of those only steps that are multiples of `keep_every`
  // are kept.
  virtual Status CompactStepTimings(const std::string& job_id, std::int64_t before_step, int keep_every) = 0;

  // GPU series. A row for the same job, time, node and GPU replaces the old
  // one. Appended in one transaction.
  virtual Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) = 0;
  // The job's rows with from <= wall_ns <= to, by time, then node, then GPU.
  virtual StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from, Nanos to) = 0;
  // Retention: of the rows before `before`, only those whose time is a
  // multiple of `keep_every` are kept.
  virtual Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) = 0;

  // The lead of `job_id`, for `holder` (unique per controller process), for
  // `ttl` on the store's clock (PostgreSQL's, whatever the hosts' clocks
  // say): taken when nobody holds it or its holder let it expire (the epoch
  // goes up by one), renewed when `holder` holds it (the epoch stays). One
  // atomic statement: of two standbys, one wins. A holder whose lead passed
  // to another cannot renew it, however soon it asks.
  virtual StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder, Nanos ttl) = 0;
  // Lets the lead go at once (a controller that ends), if `holder` holds it.
  virtual Status ReleaseLease(const std::string& job_id, const std::string& holder) = 0;
  // From now on every write of this store object is fenced to the lead of
  // `job_id` at `epoch` (0: not fenced): in the write's own transaction the
  // job's epoch is checked, and once another holder has raised it the write
  // is refused (kFailedPrecondition naming the new holder and epoch) and
  // nothing of it is stored. A leader that was paused or cut off and wakes
  // up writes nothing more (FencedBy says so).
  virtual void FenceWrites(const std::string& job_id, std::int64_t epoch) = 0;
  // The epoch that superseded this store's fence (0: none yet).
  virtual std::int64_t FencedBy() const = 0;
};

// Opens the store `where` names: a libpq URL ("postgresql://..." or
// "postgres://...") opens PostgreSQL, anything else is a SQLite file.
StatusOr<std::unique_ptr<EventStore>> OpenEventStore(const std::string& where);

// Opens (creating if needed) a SQLite store at `path`. Errors name the path.
StatusOr<std::unique_ptr<EventStore>> OpenSqliteEventStore(const std::string& path);

// Connects to PostgreSQL (`url` as libpq takes it) and creates the tables if
// they are missing. Errors name the server, never the password.
StatusOr<std::unique_ptr<EventStore>> OpenPostgresEventStore(const std::string& url);

// Whether `where` is a PostgreSQL URL.
bool IsPostgresUrl(const std::string& where);

// `where` for messages: a URL's password removed.
std::string StoreDisplayName(const std::string& where);

class InMemoryEventStore final : public EventStore {
 public:
  Status CreateJob(const JobRecord& job) override;
  Status UpdateJob(const std::string& job_id, const std::string& state, const std::string& summary,
                   Nanos ended_wall_ns) override;
  Status Append(const Event& event) override;
  Status AppendEvents(const std::vector<Event>& events) override;
  StatusOr<std::vector<Event>> EventsAfter(const std::string& job_id, std::int64_t after_id,
                                           int limit) override;
  StatusOr<std::vector<JobRecord>> Jobs() override;
  Status RecordIncident(const IncidentRecord& incident) override;
  StatusOr<std::vector<IncidentRecord>> IncidentsOnNode(const std::string& node) override;
  Status SetNodeHealth(const NodeHealth& health) override;
  StatusOr<NodeHealth> GetNodeHealth(const std::string& node) override;
  StatusOr<std::vector<NodeHealth>> ListNodeHealth() override;
  Status RecordNodeAction(const NodeAction& action) override;
  StatusOr<std::vector<NodeAction>> NodeActions(const std::string& node) override;
  Status RecordDiagnostics(const DiagnosticsRecord& record) override;
  StatusOr<std::vector<DiagnosticsRecord>> LatestDiagnostics() override;
  Status AppendStepTimings(const std::vector<StepTimingRecord>& rows) override;
  StatusOr<std::vector<StepTimingRecord>> StepTimings(const std::string& job_id, std::int64_t from,
                                                      std::int64_t to) override;
  Status CompactStepTimings(const std::string& job_id, std::int64_t before_step, int keep_every) override;
  Status AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) override;
  StatusOr<std::vector<GpuSampleRecord>> GpuSamples(const std::string& job_id, Nanos from, Nanos to) override;
  Status CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) override;
  StatusOr<JobLease> AcquireLease(const std::string& job_id, const std::string& holder, Nanos ttl) override;
  Status ReleaseLease(const std::string& job_id, const std::string& holder) override;
  void FenceWrites(const std::string& job_id, std::int64_t epoch) override;
  std::int64_t FencedBy() const override;

 private:
  // OK, or why this store's fenced writes are refused now. mu_ is held.
  Status Fence(const std::string& what);
  mutable std::mutex mu_;
  struct Lease {
    std::string holder;
    std::int64_t epoch = 0;
    Nanos expires_mono = 0;
  };
  std::map<std::string, Lease> leases_;  // by job; on the process's monotonic clock
  std::string fence_job_;
  std::int64_t fence_epoch_ = 0;
  std::int64_t fenced_by_ = 0;
  std::vector<JobRecord> jobs_;
  std::vector<Event> events_;
  std::set<std::string> uids_;  // of the records stored with one (events, incidents, node actions, diagnostics)
  // Whether a record with `uid` is new (and now known); one without is always new.
  bool NewUid(const std::string& uid) { return uid.empty() || uids_.insert(uid).second; }
  std::vector<IncidentRecord> incidents_;
  std::vector<NodeHealth> health_;
  std::vector<NodeAction> actions_;
  std::vector<DiagnosticsRecord> diagnostics_;
  std::vector<StepTimingRecord> timings_;
  std::vector<GpuSampleRecord> gpu_samples_;
};

}  // namespace trainguard
