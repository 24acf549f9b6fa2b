// JobController, continued: what the telemetry ingest (telemetry_ingest.h)
// found in the step timings, acted on under the job's lock: a node's lost
// timings recorded, the generation's layout recorded, straggler findings
// recorded with their cause and, with --straggler-action evict, acted on.
// Also the clock probes whose echoes the ingest takes.
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

void JobController::TakeTelemetry() {
  TelemetryFindings found = telemetry_.TakeFindings();
  for (const TimingsLost& lost : found.lost) {
    Emit(EventKind::kTimingsDropped, lost.node, -1, -1,
         "node " + lost.node + ": " + std::to_string(lost.dropped) +
             " timing records were lost this generation (its ranks wrote faster than the agent read)",
         json{{"dropped", lost.dropped}, {"generation", lost.generation}}.dump());
  }
  // Of a generation that ended since, they are moot.
  if (found.generation != generation_ || state_ != JobState::kRunning) return;
  if (found.layout_due) RecordLayout(*found.layout_due);
  for (const StragglerFinding& f : found.stragglers) {
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
  telemetry_.LayoutRecorded(generation_);
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

void JobController::ActOnStraggler(const StragglerFinding& original) {
  StragglerFinding f = original;
  // The cause of a straggler named, where the node's telemetry shows it
  // against the other nodes': its GPUs' clocks, its CPUs, its network; a
  // data straggler's is its loader or its storage. Where nothing stands
  // out it is said so: "unknown", with what was looked at.
  std::string cause;
  std::string looked_at;
  if (f.kind == StragglerKind::kStraggler && f.signal == StragglerSignal::kCompute && !f.node.empty()) {
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
    looked_at = "GPU clocks and throttle reasons, CPU quota throttling, steal and load";
  } else if (f.kind == StragglerKind::kStraggler && f.signal == StragglerSignal::kCommunication && !f.node.empty()) {
    std::map<std::string, NodeNet> nets;
    for (const Node& n : nodes_) {
      if (n.group_rank < 0) continue;
      nets[n.node_id] = {n.tcp_retrans_pct, link_monitor_.ErrorsPerSecond(n.node_id),
                         link_monitor_.FlapsInWindow(n.node_id)};
    }
    cause = NetworkSlowCause(f.node, nets);
    looked_at = "TCP retransmissions, link drops and errors, carrier losses";
  } else if (f.kind == StragglerKind::kStraggler && f.signal == StragglerSignal::kData) {
    cause = "storage or the data loader: rank " + std::to_string(f.rank) + " waits for its data";
  }
  const bool unknown = f.kind == StragglerKind::kStraggler && cause.empty() && !looked_at.empty();
  if (!cause.empty() && f.signal != StragglerSignal::kData) f.message += "; cause: " + f.node + " " + cause;
  if (unknown) {
    f.message += "; cause unknown: nothing in " + f.node + "'s telemetry stands out against the other nodes' (" +
                 looked_at + ")";
  }
  json d = {{"cause", unknown ? std::string("unknown") : cause},
            {"unit", f.unit},
            {"signal", StragglerSignalName(f.signal)},
            {"phase", f.phase},
            {"slowdown", f.slowdown},
            {"steps", f.steps},
            {"first_step", f.first_step},
            {"last_step", f.last_step},
            {"value_us", f.value_us},
            {"centre_us", f.centre_us},
            {"evict", f.evict},
            {"last_to_enter", f.last_to_enter},
            {"action", StragglerActionName(config_.straggler_action)}};
  if (!looked_at.empty()) d["cause_looked_at"] = looked_at;
  if (!f.measure.empty()) d["measure"] = f.measure;
  Emit(StragglerEventKind(f.kind), f.node, f.rank, f.last_step, f.message, d.dump(-1, ' ', false, kReplaceBadUtf8));
  if (f.kind != StragglerKind::kStraggler || !f.evict || config_.straggler_action != StragglerAction::kEvict) return;
  Node* node = nodes_.ById(f.node);
  if (node == nullptr || node->group_rank < 0 || state_ != JobState::kRunning) return;
  Fail(StragglerFailure(f, cause, clock_->WallNanos(), d.dump(-1, ' ', false, kReplaceBadUtf8)));
}

}  // namespace trainguard
