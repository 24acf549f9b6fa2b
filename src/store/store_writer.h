// StoreWriter: the controller's writes to an EventStore, in order, on a
// thread of their own, so that no caller ever waits on the store's I/O.
//
// The controller enqueues every write (events, incidents, cordons, job
// state, diagnostics, step timings) while it holds its own lock; one writer
// thread carries them out. While the store fails (a PostgreSQL restart or
// fail-over, a SQLite file another process holds locked), a write is retried
// with backoff (kRetryMin doubling to kRetryMax) until it succeeds: nothing
// is dropped and nothing is reordered; an event whose commit went through
// but whose answer was lost is not stored twice (Event::uid). Only a write the store refuses as
// wrong (kInvalidArgument, kFailedPrecondition: it would never succeed) is
// given up, counted and printed on stderr.
//
// Lanes. Writes go to one of three FIFO lanes; the thread always takes the
// first write of the most urgent non-empty lane:
//   kCritical  cordons and node health, node actions, incidents, the job's
//              row: what other jobs act on (a node one job evicted must be
//              refused by the next) goes first when the store comes back;
//   kEvents    the job's events and diagnostics records, in the order made;
//   kBulk      step timings and their compaction: telemetry.
// Lanes hold different tables, so lanes never reorder what one table holds.
//
// Back-pressure. The kCritical and kEvents lanes together hold `max_queued`
// writes (default 100,000, about 100 MB at the largest event sizes): a
// caller that enqueues beyond it waits until the store takes writes again
// (counted in `backpressure_waits`), but at most `backpressure_wait`
// (callers hold the controller's lock): then its write is queued over the
// limit (counted in `over_limit`, and said once per episode on stderr as an
// error naming the queue and how long the store has been away). Nothing is
// dropped there; memory grows past the limit only while the store stays away.
// The kBulk lane holds at most `max_queued_bulk` writes; a step-timing batch
// beyond that is dropped and counted (`bulk_dropped`): timings are
// telemetry, and the job must not wait for them.
//
// Read-your-writes: PendingHealth() gives the newest queued, not yet stored
// health of a node, which readers consult before the store.
//
// Thread safety: every method may be called from any thread. Nothing is
// called back. The writer's thread blocks every signal. The destructor
// drains for at most `drain_timeout` while the store takes writes (a store
// that is away is not waited for again: callers that need the drain call
// Flush with their own bound), then stops, printing on stderr how many
// writes it could not store.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "store/event_store.h"

namespace trainguard {

class StoreWriter {
 public:
  enum class Lane { kCritical = 0, kEvents = 1, kBulk = 2 };

  struct Options {
    std::size_t max_queued = 100'000;     // kCritical + kEvents; beyond: the caller waits ...
    std::chrono::milliseconds backpressure_wait{1'000};  // ... this long at most, then queues over it
    std::size_t max_queued_bulk = 2'000;  // kBulk; beyond: dropped and counted
    std::chrono::milliseconds retry_min{50};
    std::chrono::milliseconds retry_max{2'000};
    std::chrono::milliseconds drain_timeout{60'000};  // the destructor's bound
  };

  struct Stats {
    std::int64_t queued = 0;               // writes waiting now, all lanes
    std::int64_t written = 0;              // writes the store took
    std::int64_t retries = 0;              // failed attempts that were tried again
    std::int64_t given_up = 0;             // writes the store refused as wrong
    std::int64_t bulk_dropped = 0;         // timing batches dropped on a full kBulk lane
    std::int64_t backpressure_waits = 0;   // callers that waited on a full queue
    std::int64_t over_limit = 0;           // writes queued beyond max_queued after waiting backpressure_wait
    bool failing = false;                  // the last attempt failed (the store is unreachable)
    std::string last_error;                // the last failure, "" if none
    double oldest_queued_s = 0;            // how long the oldest waiting write has waited
  };

  // A write's place: durable once its lane has written through `seq`.
  struct Ticket {
    Lane lane = Lane::kEvents;
    std::uint64_t seq = 0;
  };

  // `store` must outlive the writer.
  explicit StoreWriter(EventStore* store);
  StoreWriter(EventStore* store, Options options);
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // An event (as an incident, a node action, a diagnostics record) without
  // a uid gets one of this writer's (Event::uid): retried after a commit
  // whose answer was lost, it is stored once.
  Ticket Append(Event event);
  Ticket UpdateJob(std::string job_id, std::string state, std::string summary, Nanos ended_wall_ns = 0);
  Ticket RecordIncident(IncidentRecord incident);
  Ticket SetNodeHealth(NodeHealth health);
  Ticket RecordNodeAction(NodeAction action);
  Ticket RecordDiagnostics(DiagnosticsRecord record);
  // kBulk: may be dropped (returns false) when that lane is full.
  bool AppendStepTimings(std::vector<StepTimingRecord> rows);
  bool CompactStepTimings(std::string job_id, std::int64_t before_step, int keep_every);
  bool AppendGpuSamples(std::vector<GpuSampleRecord> rows);
  bool CompactGpuSamples(std::string job_id, Nanos before, Nanos keep_every);

  // Waits (in real time) until the write is stored, or given up; false on timeout.
  bool WaitDurable(const Ticket& ticket, std::chrono::milliseconds timeout);
  // Waits until every write enqueued so far is stored or given up; false on timeout.
  bool Flush(std::chrono::milliseconds timeout);

  // The newest queued, not yet stored, health of `node`.
  std::optional<NodeHealth> PendingHealth(const std::string& node) const;

  Stats stats() const;

 private:
  struct Op {
    std::uint64_t seq = 0;
    std::function<Status(EventStore*)> write;
    std::string what;                      // for messages: "event failure", "node health of n1"
    std::optional<NodeHealth> health;      // SetNodeHealth: for PendingHealth
    std::optional<Event> event;            // Append: written in batches (EventStore::AppendEvents)
    std::chrono::steady_clock::time_point enqueued;
  };

  Ticket Enqueue(Lane lane, Op op);
  // How long the oldest queued write has waited (0: none). Under mu_.
  double OldestQueuedSeconds() const;
  // A write of the bulk lane, unless the lane is full (then counted as dropped).
  bool EnqueueBulk(std::string what, std::function<Status(EventStore*)> write);
  void Run();
  // Whether a failure with `s` is worth another attempt.
  static bool Retriable(const Status& s);

  EventStore* const store_;
  const Options options_;
  // The uid (Event::uid) of every event, incident, node action and
  // diagnostics record: this writer's random name and a count. A retry of a
  // write the store took stores nothing twice.
  std::string NextUid();
  const std::string uid_prefix_;
  std::atomic<std::uint64_t> uids_{0};

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // the thread: something to do, or stop
  std::condition_variable done_cv_;   // callers: a write finished, or room was made
  std::deque<Op> lanes_[3];
  std::uint64_t next_seq_ = 1;
  std::uint64_t done_through_[3] = {0, 0, 0};  // per lane: the seq of the last write finished
  bool in_flight_ = false;                      // the thread holds a lane's front write
  bool stop_ = false;
  bool over_limit_said_ = false;  // this episode of writes over the limit was said on stderr
  std::size_t single_left_ = 0;  // after a batch the store refused: this many written one by one
  Stats stats_;
  std::thread thread_;
};

const char* StoreWriterLaneName(StoreWriter::Lane lane);

}  // namespace trainguard
