#include "api/job_metrics.h"

#include <functional>
#include <map>
#include <set>

#include "common/gpu_reasons.h"
#include "controller/job_controller.h"
#include "store/step_timing_text.h"

namespace trainguard {

using nlohmann::json;

std::vector<NodePhaseTime> MeanPhaseTimes(const std::vector<StepTimingRecord>& rows) {
  std::map<std::string, int> rank_steps;                               // per node
  std::map<std::pair<std::string, std::string>, double> sum_us;        // per node and phase
  for (const StepTimingRecord& row : rows) {
    auto totals = DecodeTotals(row.totals);
    if (!totals.ok()) continue;
    ++rank_steps[row.node];
    for (const auto& [phase, us] : *totals) sum_us[{row.node, phase}] += static_cast<double>(us);
  }
  std::vector<NodePhaseTime> out;
  for (const auto& [key, us] : sum_us) {
    out.push_back({key.first, key.second, us / 1e6 / rank_steps[key.first]});
  }
  return out;
}

namespace {

MetricFamily Family(const std::string& name, const std::string& type, const std::string& help) {
  return {name, help, type, {}};
}

// Families filled from the same items, one figure each: a table of (family,
// the item's figure), a negative figure meaning unknown (left out).
template <typename Item>
class Columns {
 public:
  struct Column {
    MetricFamily family;
    std::function<double(const Item&)> value;
  };
  Columns(std::initializer_list<Column> columns) : columns_(columns) {}
  void Add(const Item& item, const MetricLabels& labels) {
    for (Column& c : columns_) {
      const double v = c.value(item);
      if (v >= 0) c.family.samples.push_back({labels, v});
    }
  }
  void AppendTo(std::vector<MetricFamily>* out) const {
    for (const Column& c : columns_) out->push_back(c.family);
  }

 private:
  std::vector<Column> columns_;
};

}  // namespace

std::vector<MetricFamily> JobMetrics(const JobSnapshot& job, const DowntimeReport& report,
                                     const std::vector<NodePhaseTime>& phases) {
  const MetricLabels by_job = {{"job_id", job.job_id}};
  auto with = [&](std::initializer_list<std::pair<std::string, std::string>> more) {
    MetricLabels l = by_job;
    l.insert(l.end(), more.begin(), more.end());
    return l;
  };
  std::vector<MetricFamily> out;

  MetricFamily state = Family("trainguard_job_state", "gauge",
                              "1 for the state the job is in, 0 for the others");
  for (JobState s : {JobState::kStarting, JobState::kRunning, JobState::kStopping, JobState::kDiagnosing,
                     JobState::kRestarting, JobState::kSucceeded, JobState::kFailed}) {
    state.samples.push_back({with({{"state", JobStateName(s)}}), job.state == JobStateName(s) ? 1.0 : 0.0});
  }
  out.push_back(state);

  auto single = [&](const std::string& name, const std::string& type, const std::string& help, double v) {
    MetricFamily f = Family(name, type, help);
    f.samples.push_back({by_job, v});
    out.push_back(f);
  };
  single("trainguard_job_restarts_total", "counter", "Restarts of the job's ranks", job.restart_count);
  single("trainguard_store_errors_total", "counter",
         "Reads of the store that failed and write attempts that failed (writes are retried)",
         static_cast<double>(job.store_errors));
  single("trainguard_store_queue_depth", "gauge", "Writes waiting for the store (events, cordons, timings)",
         static_cast<double>(job.store_queued));
  single("trainguard_store_write_retries_total", "counter", "Write attempts that failed and were tried again",
         static_cast<double>(job.store_retries));
  single("trainguard_store_writes_given_up_total", "counter",
         "Writes the store refused as wrong (printed on the controller's stderr)",
         static_cast<double>(job.store_given_up));
  single("trainguard_store_backpressure_waits_total", "counter",
         "Times the controller waited because the store's write queue was full",
         static_cast<double>(job.store_backpressure_waits));
  single("trainguard_store_writes_over_limit_total", "counter",
         "Writes queued beyond the write queue's limit after a bounded wait (the store was away; kept in memory)",
         static_cast<double>(job.store_over_limit));
  single("trainguard_store_timing_batches_dropped_total", "counter",
         "Step-timing batches dropped because the store's bulk queue was full",
         static_cast<double>(job.store_timings_dropped));
  single("trainguard_store_unavailable", "gauge", "1 while the store does not take writes",
         job.store_unavailable ? 1.0 : 0.0);
  single("trainguard_store_oldest_queued_seconds", "gauge", "How long the oldest waiting write has waited",
         job.store_oldest_queued_s);
  single("trainguard_job_max_restarts", "gauge", "Restarts allowed before the job fails", job.max_restarts);
  single("trainguard_job_nodes", "gauge", "Nodes of the running generation", job.active_nnodes);
  single("trainguard_job_nodes_desired", "gauge", "Nodes the job asks for (the most, if elastic)", job.nnodes);
  single("trainguard_job_generation", "gauge", "The generation (restart) running, -1 before the first",
         static_cast<double>(job.generation));
  single("trainguard_job_step", "gauge", "The newest step any rank reported, -1 before the first",
         static_cast<double>(job.max_step));
  single("trainguard_job_checkpoint_step", "gauge", "Step of the newest committed checkpoint, -1 if none",
         static_cast<double>(job.checkpoint_step));
  single("trainguard_job_steps_per_second", "gauge",
         "Step rate of the running generation's slowest rank since its first step (0 if unknown)", job.step_rate);
  single("trainguard_job_wall_seconds", "gauge", "Seconds since the job was created (to its end once ended)",
         report.wall_s);
  if (report.has_progress) {
    single("trainguard_job_ettr_ratio", "gauge", "Effective training time ratio: productive time over wall time",
           report.ettr);
    single("trainguard_job_productive_seconds", "gauge", "Step time whose work was kept", report.productive_s);
    single("trainguard_job_checkpoint_overhead_ratio", "gauge",
           "Share of the wall time the ranks were blocked in checkpoint saves",
           report.wall_s > 0 ? report.checkpoint_s / report.wall_s : 0.0);
  }
  MetricFamily downtime = Family("trainguard_job_downtime_seconds", "gauge",
                                 "Where the job's time that was not productive went, by term");
  for (const auto& [term, v] :
       std::vector<std::pair<std::string, double>>{{"startup", report.startup_s},
                                                   {"lost_work", report.lost_s},
                                                   {"detection", report.detection_s},
                                                   {"shutdown", report.shutdown_s},
                                                   {"restart", report.restart_s},
                                                   {"tail", report.tail_s},
                                                   {"checkpoint", report.checkpoint_s}}) {
    downtime.samples.push_back({with({{"term", term}}), v});
  }
  out.push_back(downtime);
  single("trainguard_job_lost_steps_total", "counter", "Steps whose work was thrown away by failures",
         static_cast<double>(report.lost_steps));

  // Incidents by the category attribution gave them; one not attributed yet
  // (being handled now) counts as "unattributed".
  std::map<std::string, int> categories;
  for (const auto& inc : report.incidents) categories[inc.value("category", std::string("unattributed"))]++;
  int counted = static_cast<int>(report.incidents.size());
  if (job.incidents > counted) categories["unattributed"] += job.incidents - counted;
  MetricFamily incidents = Family("trainguard_job_incidents_total", "counter", "Incidents by attributed category");
  for (const auto& [category, n] : categories) incidents.samples.push_back({with({{"category", category}}), static_cast<double>(n)});
  out.push_back(incidents);

  MetricFamily up = Family("trainguard_node_up", "gauge", "1 if the node's agent is connected");
  MetricFamily age = Family("trainguard_node_heartbeat_age_seconds", "gauge", "Seconds since the node's last heartbeat");
  MetricFamily info = Family("trainguard_node_info", "gauge", "The node's place in the job (always 1)");
  MetricFamily straggler = Family("trainguard_node_straggler", "gauge", "1 while the node is named a straggler");
  MetricFamily standbys = Family("trainguard_node_standbys_ready", "gauge",
                                 "Warm standby ranks ready on the node for the next start");
  MetricFamily standby_memory = Family("trainguard_node_standby_memory_bytes", "gauge",
                                       "Resident memory of the node's ready warm standby ranks");
  MetricFamily memory_checkpoints = Family("trainguard_node_memory_checkpoint_bytes", "gauge",
                                           "Bytes of checkpoints the node keeps in memory for restarts");
  for (const NodeSnapshot& n : job.nodes) {
    MetricLabels node = with({{"node", n.node_id}});
    memory_checkpoints.samples.push_back({node, static_cast<double>(n.memory_checkpoint_bytes)});
    up.samples.push_back({node, n.connected ? 1.0 : 0.0});
    if (n.heartbeat_age_s >= 0) age.samples.push_back({node, n.heartbeat_age_s});
    info.samples.push_back({with({{"node", n.node_id}, {"role", n.role}, {"group_rank", std::to_string(n.group_rank)},
                                  {"rack", n.rack}, {"address", n.address}}),
                            1.0});
    straggler.samples.push_back({node, n.straggler ? 1.0 : 0.0});
    standbys.samples.push_back({node, static_cast<double>(n.standbys_ready)});
    standby_memory.samples.push_back({node, static_cast<double>(n.standby_rss_kb) * 1024});
  }
  for (auto* f : {&up, &age, &info, &straggler, &standbys, &standby_memory, &memory_checkpoints}) out.push_back(*f);

  // Storage I/O: counters of the running processes (they start over with
  // each generation's processes; rate() takes resets in its stride).
  Columns<NodeSnapshot> storage = {
      {Family("trainguard_node_storage_read_bytes_total", "counter",
              "Bytes the node's ranks read through read() and the like (files, and any descriptor), since their "
              "processes started"),
       [](const NodeSnapshot& n) { return static_cast<double>(n.read_bytes); }},
      {Family("trainguard_node_storage_written_bytes_total", "counter",
              "Bytes the node's ranks wrote through write() and the like"),
       [](const NodeSnapshot& n) { return static_cast<double>(n.write_bytes); }},
      {Family("trainguard_node_storage_read_calls_total", "counter", "Read system calls of the node's ranks"),
       [](const NodeSnapshot& n) { return static_cast<double>(n.read_calls); }},
      {Family("trainguard_node_storage_write_calls_total", "counter", "Write system calls of the node's ranks"),
       [](const NodeSnapshot& n) { return static_cast<double>(n.write_calls); }},
      {Family("trainguard_node_storage_file_opens_total", "counter",
              "Files the node's ranks' Python code opened (open(), os.open(), imports; forked data loader workers "
              "included): the metadata rate on any file system, FUSE and local ones included"),
       [](const NodeSnapshot& n) { return static_cast<double>(n.files_opened); }},
  };
  MetricFamily blocked = Family("trainguard_node_storage_blocked_tasks", "gauge",
                                "Tasks of the node's ranks waiting now in a file system call, by mount point");
  for (const NodeSnapshot& n : job.nodes) {
    if (n.group_rank < 0) continue;
    storage.Add(n, with({{"node", n.node_id}}));
    for (const auto& [mount, count] : n.blocked_by_mount) {
      blocked.samples.push_back({with({{"node", n.node_id}, {"mount", mount}}), static_cast<double>(count)});
    }
  }
  storage.AppendTo(&out);
  out.push_back(blocked);

  // The network as the node's kernel counts it (the straggler's network cause).
  Columns<NodeSnapshot> network = {
      {Family("trainguard_node_tcp_retransmit_ratio", "gauge",
              "Share of the TCP segments the node sent between its last two heartbeats that were "
              "retransmissions (0-1)"),
       [](const NodeSnapshot& n) { return n.tcp_retrans_pct < 0 ? -1 : n.tcp_retrans_pct / 100; }},
      {Family("trainguard_node_link_errors_per_second", "gauge",
              "Packets the node's links dropped or had in error per second, between its last two heartbeats"),
       [](const NodeSnapshot& n) { return n.link_errors_per_s; }},
  };
  for (const NodeSnapshot& n : job.nodes) {
    if (n.group_rank >= 0) network.Add(n, with({{"node", n.node_id}}));
  }
  network.AppendTo(&out);

  // Per mount of each node, the kernel's counters (block devices, NFS):
  // the whole node's traffic on it, the job's and anyone else's.
  Columns<v1::MountIo> mounts = {
      {Family("trainguard_node_mount_read_bytes_total", "counter",
              "Bytes read from the mount's device or server, by node and mount"),
       [](const v1::MountIo& m) { return static_cast<double>(m.read_bytes()); }},
      {Family("trainguard_node_mount_written_bytes_total", "counter",
              "Bytes written to the mount's device or server, by node and mount"),
       [](const v1::MountIo& m) { return static_cast<double>(m.write_bytes()); }},
      {Family("trainguard_node_mount_reads_total", "counter",
              "Read requests completed (block) or READ operations (NFS), by node and mount"),
       [](const v1::MountIo& m) { return static_cast<double>(m.reads()); }},
      {Family("trainguard_node_mount_writes_total", "counter",
              "Write requests completed (block) or WRITE operations (NFS), by node and mount"),
       [](const v1::MountIo& m) { return static_cast<double>(m.writes()); }},
      {Family("trainguard_node_mount_metadata_ops_total", "counter",
              "Metadata operations (NFS: OPEN, LOOKUP, GETATTR, ...), by node and mount"),
       [](const v1::MountIo& m) { return static_cast<double>(m.metadata_ops()); }},  // -1: not counted
  };
  for (const NodeSnapshot& n : job.nodes) {
    for (const v1::MountIo& m : n.mounts) {
      mounts.Add(m, with({{"node", n.node_id}, {"mount", m.mount_point()}, {"fstype", m.fstype()}}));
    }
  }
  mounts.AppendTo(&out);

  // GPU health, per GPU (node and index): what NVML or nvidia-smi said at
  // the node's latest heartbeat; an unknown figure is left out.
  Columns<v1::GpuHealth> gpu = {
      {Family("trainguard_gpu_utilization_ratio", "gauge", "GPU utilisation (0-1)"),
       [](const v1::GpuHealth& g) { return g.utilization_pct() < 0 ? -1 : g.utilization_pct() / 100; }},
      {Family("trainguard_gpu_sm_clock_hertz", "gauge", "SM clock"),
       [](const v1::GpuHealth& g) { return g.sm_clock_mhz() < 0 ? -1 : g.sm_clock_mhz() * 1e6; }},
      {Family("trainguard_gpu_memory_clock_hertz", "gauge", "Memory clock"),
       [](const v1::GpuHealth& g) { return g.memory_clock_mhz() < 0 ? -1 : g.memory_clock_mhz() * 1e6; }},
      {Family("trainguard_gpu_temperature_celsius", "gauge", "GPU temperature"),
       [](const v1::GpuHealth& g) { return g.temperature_c(); }},
      {Family("trainguard_gpu_power_watts", "gauge", "Power draw"), [](const v1::GpuHealth& g) { return g.power_w(); }},
      {Family("trainguard_gpu_ecc_corrected_errors", "gauge", "Corrected ECC errors since the driver loaded"),
       [](const v1::GpuHealth& g) { return static_cast<double>(g.ecc_corrected()); }},
      {Family("trainguard_gpu_ecc_uncorrected_errors", "gauge", "Uncorrected ECC errors since the driver loaded"),
       [](const v1::GpuHealth& g) { return static_cast<double>(g.ecc_uncorrected()); }},
      {Family("trainguard_gpu_remapped_rows_pending", "gauge", "Row remaps waiting for a GPU reset"),
       [](const v1::GpuHealth& g) { return static_cast<double>(g.remapped_rows_pending()); }},
      {Family("trainguard_gpu_pcie_replays", "gauge", "PCIe replays"),
       [](const v1::GpuHealth& g) { return static_cast<double>(g.pcie_replays()); }},
      {Family("trainguard_gpu_nvlink_errors", "gauge", "NVLink replay, recovery and CRC errors over every link"),
       [](const v1::GpuHealth& g) { return static_cast<double>(g.nvlink_errors()); }},
  };
  MetricFamily throttled = Family("trainguard_gpu_throttled", "gauge",
                                  "1 for each reason the GPU's clocks are held down now (thermal, power, hardware)");
  for (const NodeSnapshot& n : job.nodes) {
    for (const v1::GpuHealth& g : n.gpus) {
      gpu.Add(g, with({{"node", n.node_id}, {"gpu", std::to_string(g.index())}}));
      for (const std::string& reason : ThrottleReasonNames(g.throttle_reasons())) {
        throttled.samples.push_back(
            {with({{"node", n.node_id}, {"gpu", std::to_string(g.index())}, {"reason", reason}}), 1.0});
      }
    }
  }
  gpu.AppendTo(&out);
  out.push_back(throttled);

  MetricFamily phase = Family("trainguard_node_phase_seconds", "gauge",
                              "Seconds per step the node's ranks spent in a phase, mean over the newest steps");
  for (const NodePhaseTime& p : phases) phase.samples.push_back({with({{"node", p.node}, {"phase", p.phase}}), p.seconds});
  out.push_back(phase);

  MetricFamily step = Family("trainguard_rank_step", "gauge", "The newest step each rank reported");
  MetricFamily progress = Family("trainguard_rank_progress_age_seconds", "gauge",
                                 "Seconds since each rank's newest step (or its launch)");
  for (const RankSnapshot& r : job.ranks) {
    MetricLabels rank = with({{"rank", std::to_string(r.rank)}, {"node", r.node}});
    step.samples.push_back({rank, static_cast<double>(r.step)});
    progress.samples.push_back({rank, static_cast<double>(r.progress_age_ms) / 1000});
  }
  out.push_back(step);
  out.push_back(progress);
  return out;
}

}  // namespace trainguard
