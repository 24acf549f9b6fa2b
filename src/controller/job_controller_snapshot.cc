// JobController::Snapshot: a copy of the job for readers outside the
// controller (the HTTP API and /metrics).
#include <algorithm>

#include "controller/job_controller.h"

namespace trainguard {

namespace {

std::string DescribeWait(const v1::RankStatus& s, std::int64_t* waiting_ms) {
  *waiting_ms = 0;
  if (s.ops_in_flight_size() == 0) return "";
  // The oldest operation in flight is the one the rank waits in.
  const v1::CommOp* oldest = &s.ops_in_flight(0);
  for (const auto& op : s.ops_in_flight()) {
    if (op.age_ms() > oldest->age_ms()) oldest = &op;
  }
  *waiting_ms = oldest->age_ms();
  std::string what = oldest->op();
  if (oldest->peer() >= 0) what += (oldest->op() == "recv" ? " from rank " : " to rank ") + std::to_string(oldest->peer());
  if (oldest->group_id() >= 0) what += " on group " + std::to_string(oldest->group_id());
  return what;
}

}  // namespace

JobSnapshot JobController::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  JobSnapshot s;
  s.job_id = config_.job_id;
  s.state = JobStateName(state_);
  s.finished = state_ == JobState::kSucceeded || state_ == JobState::kFailed;
  s.nnodes = config_.nnodes;
  s.active_nnodes = active_nnodes_;
  s.nproc_per_node = config_.nproc_per_node;
  s.max_restarts = config_.max_restarts;
  s.restart_count = restart_count_;
  s.generation = generation_;
  s.generation_first_step_unix_ms = first_step_wall_ / kMillisecond;
  s.generation_first_step = first_step_no_;
  s.max_step = MaxStep();
  s.checkpoint_step = checkpoint_step_;
  s.checkpoint_overhead_ms = CheckpointOverheadMs();
  s.checkpoint_wait_ms = CheckpointWaitMs();
  s.data_wait_ms = telemetry_.DataWaitMs();
  s.checkpoint_saves = checkpoints_.saves();
  s.incident_open = incident_.has_value();
  s.incidents = incident_count_;
  const StoreWriter::Stats w = writer_->stats();
  s.store_errors = store_read_errors_ + w.retries + w.given_up;
  s.store_queued = w.queued;
  s.store_retries = w.retries;
  s.store_given_up = w.given_up;
  s.store_backpressure_waits = w.backpressure_waits;
  s.store_over_limit = w.over_limit;
  s.store_timings_dropped = w.bulk_dropped;
  s.store_unavailable = w.failing;
  s.store_oldest_queued_s = w.oldest_queued_s;
  s.last_failure = last_failure_;
  s.summary = summary_;
  s.now_wall = clock_->WallNanos();
  s.heartbeat_interval = config_.heartbeat_interval;
  const Nanos now_mono = clock_->MonotonicNanos();
  const std::set<std::string> stragglers = telemetry_.Stragglers();
  double slowest_rate = 0;
  bool rate_known = false;
  for (const Node& n : nodes_) {
    NodeSnapshot node;
    node.node_id = n.node_id;
    node.group_rank = n.group_rank;
    node.connected = n.conn != 0;
    node.role = n.group_rank >= 0 ? (node.connected ? "member" : "away") : (node.connected ? "spare" : "out");
    node.address = n.address;
    node.rack = n.rack;
    node.heartbeat_age_s =
        n.last_heartbeat_mono > 0 ? static_cast<double>(now_mono - n.last_heartbeat_mono) / kSecond : -1;
    node.straggler = stragglers.count(n.node_id) > 0;
    node.standbys_ready = n.standbys_ready;
    node.standby_rss_kb = n.standby_rss_kb;
    node.memory_checkpoint_bytes = n.memory_checkpoint_bytes;
    node.gpus = n.gpus;
    node.mounts = n.mounts;
    node.tcp_retrans_pct = n.tcp_retrans_pct;
    node.link_errors_per_s = link_monitor_.ErrorsPerSecond(n.node_id);
    if (n.group_rank >= 0) {
      for (const auto& [rank, view] : n.ranks) {
        if (!view.status.running()) continue;
        const v1::StorageIo& io = view.status.io();
        node.read_bytes += io.rchar();
        node.write_bytes += io.wchar();
        node.read_calls += io.syscr();
        node.write_calls += io.syscw();
        node.files_opened += std::max<std::int64_t>(0, io.files_opened());
        for (const auto& b : view.status.blocked_io()) node.blocked_by_mount[b.mount_point()]++;
      }
    }
    s.nodes.push_back(node);
    if (n.group_rank < 0) continue;
    for (const auto& [rank, view] : n.ranks) {
      const v1::RankStatus& st = view.status;
      RankSnapshot r;
      r.rank = rank;
      r.local_rank = st.local_rank();
      r.node = n.node_id;
      r.pid = st.pid();
      r.running = st.running();
      r.attached = st.attached();
      r.step = st.step();
      r.step_count = st.step_count();
      r.phase = st.phase();
      r.phase_age_ms = st.phase_age_ms();
      r.progress_age_ms = st.progress_age_ms();
      r.checkpoint_step = st.checkpoint_step();
      r.first_step_unix_ms = st.first_step_unix_ms();
      r.last_step_unix_ms = st.last_step_unix_ms();
      r.waiting_in = DescribeWait(st, &r.waiting_ms);
      s.ranks.push_back(r);
      s.newest_step_unix_ms = std::max(s.newest_step_unix_ms, r.last_step_unix_ms);
      if (r.step_count > 1 && r.last_step_unix_ms > r.first_step_unix_ms) {
        double rate = static_cast<double>(r.step_count - 1) * 1000.0 /
                      static_cast<double>(r.last_step_unix_ms - r.first_step_unix_ms);
        slowest_rate = rate_known ? std::min(slowest_rate, rate) : rate;
        rate_known = true;
      }
    }
  }
  s.step_rate = slowest_rate;
  std::sort(s.nodes.begin(), s.nodes.end(),
            [](const NodeSnapshot& a, const NodeSnapshot& b) { return a.node_id < b.node_id; });
  std::sort(s.ranks.begin(), s.ranks.end(), [](const RankSnapshot& a, const RankSnapshot& b) { return a.rank < b.rank; });
  return s;
}

}  // namespace trainguard
