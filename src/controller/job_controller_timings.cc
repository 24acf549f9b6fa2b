// JobController, continued: the telemetry of step timings. Agents send each
// rank's finished steps with their phases and operations; they go into the
// store on the controller's clock (each node's offset, estimated from clock
// probes, removed) and through the straggler detector, whose findings are
// recorded and, with --straggler-action evict, acted on.
#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "controller/gpu_health.h"
#include "controller/hang_locator.h"
#include "controller/job_controller.h"
#include "store/step_timing_text.h"

namespace trainguard {

using nlohmann::json;

void JobController::ProbeClocks() {
  Nanos now = clock_->MonotonicNanos();
  if (now < next_clock_probe_mono_) return;
  next_clock_probe_mono_ = now + config_.clock_probe_interval;
  v1::ControllerMessage probe;
  probe.mutable_clock_probe()->set_controller_unix_us(clock_->WallNanos() / 1000);
  for (auto& n : nodes_) {
    if (n.conn != 0 && !n.node_id.empty() && n.link) n.link->Send(probe);
  }
}

void JobController::HandleClockEcho(Node* node, const v1::ClockEcho& echo, Nanos arrived_mono) {
  // The round trip ends when the echo arrived, however long it then waited
  // for the controller (it began when the probe was written: the transport
  // stamps it then).
  Nanos now_mono = clock_->MonotonicNanos();
  Nanos waited = arrived_mono > 0 && arrived_mono <= now_mono ? now_mono - arrived_mono : 0;
  clock_sync_.AddSample(node->node_id, echo.controller_unix_us(), echo.agent_unix_us(),
                        (clock_->WallNanos() - waited) / 1000);
}

void JobController::HandleTimings(Node* node, const v1::Timings& t) {
  ClockEstimate clock = clock_sync_.Estimate(node->node_id);
  std::vector<StepTimingRecord> rows;
  rows.reserve(static_cast<std::size_t>(t.steps_size()));
  const bool current = t.generation() == generation_ && state_ == JobState::kRunning;
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
    r.node = node->node_id;
    r.step = st.step();
    // An offset within its own uncertainty is indistinguishable from none
    // (nodes on one host): not applied, so that it adds no error.
    r.start_us = st.start_unix_us() - (std::llabs(clock.offset_us) > clock.error_us ? clock.offset_us : 0);
    r.duration_us = st.duration_us();
    r.clock_error_us = clock.known ? clock.error_us : -1;
    r.totals = EncodeTotals(totals);
    r.intervals = EncodeIntervals(intervals);
    rows.push_back(std::move(r));
    timing_newest_step_ = std::max(timing_newest_step_, st.step());
    if (current) {
      RankStep rs;
      rs.node = node->node_id;
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
  }
  if (!rows.empty()) writer_->AppendStepTimings(std::move(rows));

  std::int64_t& said = timings_dropped_[node->node_id];
  if (t.dropped() > said) {
    Emit(EventKind::kTimingsDropped, node->node_id, -1, -1,
         "node " + node->node_id + ": " + std::to_string(t.dropped()) +
             " timing records were lost this generation (its ranks wrote faster than the agent read)",
         json{{"dropped", t.dropped()}, {"generation", t.generation()}}.dump());
    said = t.dropped();
  }

  // Retention: intervals only for the newest steps, totals for a sample of the rest.
  if (timing_newest_step_ - config_.timing_detail_steps >= timing_compacted_below_ + 1000) {
    timing_compacted_below_ = timing_newest_step_ - config_.timing_detail_steps;
    writer_->CompactStepTimings(config_.job_id, timing_compacted_below_, config_.timing_keep_every);
  }

  if (!current) return;
  timing_rows_this_generation_ += t.steps_size();
  const std::int64_t world = static_cast<std::int64_t>(active_nnodes_) * config_.nproc_per_node;
  if (layout_generation_ != generation_ && timing_rows_this_generation_ >= layout_next_try_rows_) {
    // Every 10 steps' worth of rows until every rank has reported its groups
    // (they come with heartbeats); after 100 steps' worth, as it is.
    layout_next_try_rows_ = timing_rows_this_generation_ + 10 * world;
    RecordLayout(timing_rows_this_generation_ >= 100 * world);
  }
  for (const StragglerFinding& f : stragglers_.Evaluate()) {
    ActOnStraggler(f);
    if (state_ != JobState::kRunning) break;
  }
}

void JobController::RecordLayout(bool final_try) {
  HangLocation loc = LocateHang(View());
  bool complete = loc.has_journal;
  for (const RankWait& r : loc.ranks) {
    if (r.rank >= 0 && r.coords.size() < loc.layout.size()) complete = false;
  }
  if (!complete && !final_try) return;
  layout_generation_ = generation_;
  if (!loc.has_journal) return;
  std::string dims;
  json layout = json::array();
  for (const LayoutDim& d : loc.layout) {
    dims += (dims.empty() ? "" : " x ") + d.name + std::to_string(d.size);
    layout.push_back({{"name", d.name}, {"size", d.size}, {"stride", d.stride}});
  }
  json ranks = json::array();
  for (const RankWait& r : loc.ranks) {
    if (r.rank >= 0) ranks.push_back({{"rank", r.rank}, {"node", r.node}, {"coords", r.coords}, {"name", loc.Name(r.rank)}});
  }
  Emit(EventKind::kLayout, "", -1, -1,
       "parallel layout of generation " + std::to_string(generation_) + ": " + (dims.empty() ? "one group" : dims) +
           " over " + std::to_string(loc.world_size) + " ranks",
       json{{"generation", generation_}, {"world_size", loc.world_size}, {"layout", layout}, {"ranks", ranks}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
}

void JobController::KeepGpuSeries(Node* node) {
  if (node->gpus.empty() || gpu_series_.interval() <= 0) return;
  std::vector<GpuSampleRecord> closed = gpu_series_.Add(node->node_id, node->gpus, clock_->WallNanos());
  gpu_rows_.insert(gpu_rows_.end(), std::make_move_iterator(closed.begin()), std::make_move_iterator(closed.end()));
}

void JobController::WriteGpuSeries() {
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

void JobController::ActOnStraggler(const StragglerFinding& original) {
  StragglerFinding f = original;
  // The cause, where the node's telemetry shows it against the other
  // nodes': its GPUs' clocks, its CPUs; a data straggler's is its loader
  // or its storage.
  std::string cause;
  if (f.signal == StragglerSignal::kCompute && !f.node.empty()) {
    std::map<std::string, std::vector<v1::GpuHealth>> gpus;
    std::map<std::string, NodeCpu> cpus;
    for (const Node& n : nodes_) {
      if (n.group_rank < 0) continue;
      gpus[n.node_id] = n.gpus;
      cpus[n.node_id] = n.cpu;
    }
    cause = GpuSlowCause(f.node, gpus);
    const std::string cpu = CpuSlowCause(f.node, cpus);
    cause += (cause.empty() || cpu.empty() ? "" : "; ") + cpu;
    if (!cause.empty()) f.message += "; cause: " + f.node + " " + cause;
  } else if (f.signal == StragglerSignal::kCommunication && !f.node.empty()) {
    std::map<std::string, NodeNet> nets;
    for (const Node& n : nodes_) {
      if (n.group_rank < 0) continue;
      nets[n.node_id] = {n.tcp_retrans_pct, link_monitor_.ErrorsPerSecond(n.node_id),
                         link_monitor_.FlapsInWindow(n.node_id)};
    }
    cause = NetworkSlowCause(f.node, nets);
    if (!cause.empty()) f.message += "; cause: " + f.node + " " + cause;
  } else if (f.signal == StragglerSignal::kData) {
    cause = "storage or the data loader: rank " + std::to_string(f.rank) + " waits for its data";
  }
  json d = {{"cause", cause}, {"unit", f.unit}, {"signal", StragglerSignalName(f.signal)},         {"phase", f.phase},          {"slowdown", f.slowdown},
            {"steps", f.steps},           {"first_step", f.first_step}, {"last_step", f.last_step},
            {"value_us", f.value_us},     {"centre_us", f.centre_us},   {"evict", f.evict},
            {"last_to_enter", f.last_to_enter},
            {"action", StragglerActionName(config_.straggler_action)}};
  Emit(StragglerEventKind(f.kind), f.node, f.rank, f.last_step, f.message, d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (f.kind != StragglerKind::kStraggler || !f.evict || config_.straggler_action != StragglerAction::kEvict) return;
  Node* node = nodes_.ById(f.node);
  if (node == nullptr || node->group_rank < 0 || state_ != JobState::kRunning) return;
  Fail(StragglerFailure(f, cause, clock_->WallNanos(), d.dump(-1, ' ', false, kReplaceBadUtf8)));
}

}  // namespace trainguard
