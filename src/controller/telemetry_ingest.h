// TelemetryIngest: what agents send about their steps and clocks, taken in
// without the job's lock. At a fleet's size the step timings are the
// heaviest traffic a controller gets (every rank's every step, with its
// phases and collectives); handling them under the JobController's mutex
// held heartbeats, Tick and the HTTP API up behind them.
//
// It owns what it learns from that traffic:
// - each node's clock offset (ClockSync, from the echoes of clock probes);
// - step timings, into the store on the controller's clock (the node's
//   offset removed), and their retention;
// - the straggler detector, and this generation's waits for data;
// - per node, how many timings its agent lost;
// - each GPU's downsampled series (heartbeats bring the samples).
//
// The controller tells it who is who (Joined/Left: a connection's node) and
// which generation runs (StartGeneration, SetRunning, Resume); it reads
// nothing else of the job. What it found waits in its inbox as typed
// findings (TelemetryFindings) until the controller takes them under the
// job's lock: straggler findings, a node's lost timings, that the
// generation's layout is due to be recorded. OnTimings says when there is
// something to take, so that the job's lock is taken only then.
//
// Thread safety: every method may be called from any thread; one mutex of
// its own. The controller calls it with its lock held (lock order: the
// job's, then this one); it never calls back into the controller.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "controller/clock_sync.h"
#include "controller/data_wait.h"
#include "controller/gpu_series.h"
#include "controller/job_config.h"
#include "controller/straggler_detector.h"
#include "proto/protocol.h"
#include "store/store_writer.h"

namespace trainguard {

// A node's agent lost timings (its ranks wrote faster than it read).
struct TimingsLost {
  std::string node;
  std::int64_t dropped = 0;  // this generation, as the agent counts them
  std::int64_t generation = -1;
};

struct TelemetryFindings {
  std::int64_t generation = -1;              // the generation the stragglers are of
  std::vector<StragglerFinding> stragglers;  // in the order found
  std::vector<TimingsLost> lost;
  // Record the generation's parallel layout now; true: as it is, even if
  // some rank's coordinates are still unknown (its last try).
  std::optional<bool> layout_due;
  bool empty() const { return stragglers.empty() && lost.empty() && !layout_due; }
};

// A straggler the job reported before a controller restart (from its
// events): not reported again by the successor.
struct ReportedStraggler {
  std::string unit;
  StragglerSignal signal = StragglerSignal::kCompute;
  std::int64_t first_step = 0;
  std::int64_t named_step = 0;  // the step of its naming (the event's last step)
  bool evict_said = false;
};

class TelemetryIngest {
 public:
  TelemetryIngest(const JobConfig& config, Clock* clock, StoreWriter* writer);

  // --- what the controller tells it (under the job's lock) ---
  // The node `node_id` speaks on `conn` from now on / no longer does.
  void Joined(std::uint64_t conn, const std::string& node_id);
  void Left(std::uint64_t conn);
  // A generation of `world` ranks starts, running: stragglers, data waits
  // and the layout's count start afresh; findings of earlier ones are dropped.
  void StartGeneration(std::int64_t generation, int world);
  // A controller restart resumes `generation` (running), whose stragglers
  // were reported already and whose layout was recorded if
  // `layout_generation` is it.
  void Resume(std::int64_t generation, int world, const std::vector<ReportedStraggler>& reported,
              std::int64_t layout_generation);
  // Whether the generation runs: only a running one's steps are judged.
  void SetRunning(bool running);
  // The controller recorded (or gave up on) the layout of `generation`.
  void LayoutRecorded(std::int64_t generation);

  // --- what agents send (from the transport, without the job's lock) ---
  // True when findings wait to be taken.
  bool OnTimings(std::uint64_t conn, const v1::Timings& timings);
  void OnClockEcho(std::uint64_t conn, const v1::ClockEcho& echo, Nanos arrived_mono);
  // A heartbeat's GPUs (heartbeats are the job's: the controller passes them on).
  void AddGpus(const std::string& node_id, const std::vector<v1::GpuHealth>& gpus);
  // Once a tick: quiet GPUs' intervals closed, closed ones to the store,
  // old rows thinned.
  void WriteGpuSeries();

  // --- what the controller reads ---
  TelemetryFindings TakeFindings();
  double DataWaitMs() const;
  std::set<std::string> Stragglers() const;
  ClockEstimate ClockOf(const std::string& node_id) const;

 private:
  // Adds the node's steps to the store's rows and, when current, to the
  // detector; under mu_.
  void Ingest(const std::string& node, const v1::Timings& t, bool current);

  const JobConfig config_;
  Clock* const clock_;
  StoreWriter* const writer_;

  mutable std::mutex mu_;
  std::unordered_map<std::uint64_t, std::string> node_of_conn_;
  std::int64_t generation_ = -1;
  bool running_ = false;
  int world_ = 0;
  ClockSync clock_sync_;
  StragglerDetector stragglers_;
  StepMaxSum data_wait_;  // this generation's steps' longest waits for data (data_wait.h)
  std::map<std::string, std::int64_t> timings_dropped_;  // per node, the last count reported
  std::int64_t newest_step_ = -1;
  std::int64_t compacted_below_ = 0;
  std::int64_t rows_this_generation_ = 0;
  std::int64_t layout_generation_ = -1;  // the generation whose layout was recorded
  std::int64_t layout_next_try_rows_ = 0;
  GpuSeries gpu_series_;
  std::vector<GpuSampleRecord> gpu_rows_;  // closed intervals not yet handed to the writer
  Nanos gpu_series_flushed_ = 0;
  Nanos gpu_series_compacted_ = 0;
  TelemetryFindings found_;  // the inbox
};

}  // namespace trainguard
