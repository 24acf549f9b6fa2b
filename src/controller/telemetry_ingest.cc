// TelemetryIngest (telemetry_ingest.h): step timings, clock echoes and GPU
// series, under a lock of its own.
#include "controller/telemetry_ingest.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "store/step_timing_text.h"

namespace trainguard {

TelemetryIngest::TelemetryIngest(const JobConfig& config, Clock* clock, StoreWriter* writer)
    : config_(config),
      clock_(clock),
      writer_(writer),
      stragglers_(config.straggler),
      gpu_series_(config.job_id, config.gpu_series_interval) {}

void TelemetryIngest::Joined(std::uint64_t conn, const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  node_of_conn_[conn] = node_id;
}

void TelemetryIngest::Left(std::uint64_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  node_of_conn_.erase(conn);
}

void TelemetryIngest::StartGeneration(std::int64_t generation, int world) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_ = generation;
  running_ = true;
  world_ = world;
  stragglers_.Reset(world);
  data_wait_.Reset();
  timings_dropped_.clear();  // agents count their losses per generation
  rows_this_generation_ = 0;
  // The first try once a step's worth of rows came: before, most ranks have
  // not reported their groups, and a try reads every rank (100,000 in a big
  // job) under the job's lock.
  layout_next_try_rows_ = world;
  found_ = TelemetryFindings{};
}

void TelemetryIngest::Resume(std::int64_t generation, int world, const std::vector<ReportedStraggler>& reported,
                             std::int64_t layout_generation) {
  std::lock_guard<std::mutex> lock(mu_);
  generation_ = generation;
  running_ = true;
  world_ = world;
  stragglers_.Reset(world);
  for (const ReportedStraggler& r : reported) {
    stragglers_.RestoreReported(r.unit, r.signal, r.first_step, r.named_step, r.evict_said);
  }
  layout_generation_ = layout_generation;
  found_ = TelemetryFindings{};
}

void TelemetryIngest::SetRunning(bool running) {
  std::lock_guard<std::mutex> lock(mu_);
  running_ = running;
}

void TelemetryIngest::LayoutRecorded(std::int64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  layout_generation_ = generation;
}

void TelemetryIngest::OnClockEcho(std::uint64_t conn, const v1::ClockEcho& echo, Nanos arrived_mono) {
  // The round trip ends when the echo arrived, however long it then waited
  // to be handled (it began when the probe was written: the transport
  // stamps it then).
  const Nanos now_mono = clock_->MonotonicNanos();
  const Nanos waited = arrived_mono > 0 && arrived_mono <= now_mono ? now_mono - arrived_mono : 0;
  const Nanos received_wall = clock_->WallNanos() - waited;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = node_of_conn_.find(conn);
  if (it == node_of_conn_.end()) return;  // not (or no longer) a node of the job
  clock_sync_.AddSample(it->second, echo.controller_unix_us(), echo.agent_unix_us(), received_wall / 1000);
}

bool TelemetryIngest::OnTimings(std::uint64_t conn, const v1::Timings& t) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = node_of_conn_.find(conn);
  if (it == node_of_conn_.end()) return false;
  const std::string node = it->second;
  const bool current = running_ && t.generation() == generation_;
  Ingest(node, t, current);

  std::int64_t& said = timings_dropped_[node];
  if (t.dropped() > said) {
    found_.lost.push_back({node, t.dropped(), t.generation()});
    said = t.dropped();
  }
  // Retention: intervals only for the newest steps, totals for a sample of the rest.
  if (newest_step_ - config_.timing_detail_steps >= compacted_below_ + 1000) {
    compacted_below_ = newest_step_ - config_.timing_detail_steps;
    writer_->CompactStepTimings(config_.job_id, compacted_below_, config_.timing_keep_every);
  }
  if (current) {
    rows_this_generation_ += t.steps_size();
    const std::int64_t world = world_;
    if (layout_generation_ != generation_ && rows_this_generation_ >= layout_next_try_rows_) {
      // Every 10 steps' worth of rows until every rank has reported its
      // groups (they come with heartbeats); after 100 steps' worth, as it is.
      layout_next_try_rows_ = rows_this_generation_ + 10 * world;
      found_.layout_due = found_.layout_due.value_or(false) || rows_this_generation_ >= 100 * world;
    }
    std::vector<StragglerFinding> found = stragglers_.Evaluate();
    found_.generation = generation_;
    found_.stragglers.insert(found_.stragglers.end(), std::make_move_iterator(found.begin()),
                             std::make_move_iterator(found.end()));
  }
  return !found_.empty();
}

void TelemetryIngest::Ingest(const std::string& node, const v1::Timings& t, bool current) {
  const ClockEstimate clock = clock_sync_.Estimate(node);
  // An offset within its own uncertainty is indistinguishable from none
  // (nodes on one host): not applied, so that it adds no error.
  const std::int64_t offset_us = std::llabs(clock.offset_us) > clock.error_us ? clock.offset_us : 0;
  std::vector<StepTimingRecord> rows;
  rows.reserve(static_cast<std::size_t>(t.steps_size()));
  for (const v1::StepTiming& st : t.steps()) {
    std::vector<TimedInterval> intervals;
    intervals.reserve(static_cast<std::size_t>(st.intervals_size()));
    for (const v1::PhaseInterval& pi : st.intervals()) {
      if (pi.name() < 0 || pi.name() >= t.names_size()) continue;  // a malformed message: skip the interval
      TimedInterval i;
      i.name = t.names(pi.name());
      i.kind = pi.kind();
      i.start_us = pi.start_us();
      i.duration_us = pi.duration_us();
      i.group_id = pi.group_id();
      i.seq = pi.seq();
      i.peer = pi.peer();
      i.numel = pi.numel();
      intervals.push_back(std::move(i));
    }
    PhaseTotals totals = SumByKey(intervals);
    StepTimingRecord r;
    r.job_id = config_.job_id;
    r.generation = t.generation();
    r.rank = st.global_rank();
    r.node = node;
    r.step = st.step();
    r.start_us = st.start_unix_us() - offset_us;
    r.duration_us = st.duration_us();
    r.clock_error_us = clock.known ? clock.error_us : -1;
    r.totals = EncodeTotals(totals);
    r.intervals = EncodeIntervals(intervals);
    newest_step_ = std::max(newest_step_, st.step());
    if (current) {
      RankStep rs;
      rs.node = node;
      rs.rank = st.global_rank();
      rs.step = st.step();
      rs.step_us = static_cast<double>(st.duration_us());
      for (const auto& [key, us] : totals) rs.phases[key] += static_cast<double>(us);
      for (const TimedInterval& i : intervals) {
        if (i.kind == kIntervalCollective) {
          rs.collectives.emplace_back(i.group_id, i.seq, static_cast<double>(r.start_us + i.start_us));
        }
      }
      FillSignals(&rs);
      stragglers_.Add(rs);
      for (const auto& [key, us] : totals) {
        if (key == "data") data_wait_.Add(st.step(), static_cast<double>(us));
      }
    }
    rows.push_back(std::move(r));
  }
  if (!rows.empty()) writer_->AppendStepTimings(std::move(rows));
}

void TelemetryIngest::AddGpus(const std::string& node_id, const std::vector<v1::GpuHealth>& gpus) {
  if (gpus.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (gpu_series_.interval() <= 0) return;
  std::vector<GpuSampleRecord> closed = gpu_series_.Add(node_id, gpus, clock_->WallNanos());
  gpu_rows_.insert(gpu_rows_.end(), std::make_move_iterator(closed.begin()), std::make_move_iterator(closed.end()));
}

void TelemetryIngest::WriteGpuSeries() {
  std::lock_guard<std::mutex> lock(mu_);
  const Nanos interval = gpu_series_.interval();
  if (interval <= 0) return;
  // Once per interval: close the intervals of GPUs that fell quiet, and
  // thin rows older than an hour to one per 10 minutes.
  const Nanos now = clock_->WallNanos();
  if (now - gpu_series_flushed_ >= interval) {
    gpu_series_flushed_ = now;
    std::vector<GpuSampleRecord> quiet = gpu_series_.Flush(now);
    gpu_rows_.insert(gpu_rows_.end(), std::make_move_iterator(quiet.begin()), std::make_move_iterator(quiet.end()));
    const Nanos keep = gpu_series_.KeepEvery(600 * kSecond);
    if (now - gpu_series_compacted_ >= keep) {
      gpu_series_compacted_ = now;
      writer_->CompactGpuSamples(config_.job_id, now - 3600 * kSecond, keep);
    }
  }
  if (gpu_rows_.empty()) return;
  writer_->AppendGpuSamples(std::move(gpu_rows_));  // one transaction for every closed interval since the last tick
  gpu_rows_.clear();
}

TelemetryFindings TelemetryIngest::TakeFindings() {
  std::lock_guard<std::mutex> lock(mu_);
  TelemetryFindings taken = std::move(found_);
  found_ = TelemetryFindings{};
  return taken;
}

double TelemetryIngest::DataWaitMs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_wait_.TotalUs() / 1000;
}

std::set<std::string> TelemetryIngest::Stragglers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stragglers_.Stragglers();
}

ClockEstimate TelemetryIngest::ClockOf(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return clock_sync_.Estimate(node_id);
}

}  // namespace trainguard
