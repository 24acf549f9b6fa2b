// JobController::Tick: what time alone tells — silent nodes
// (heartbeat_detector), hangs (hang_detector, located by hang_locator), stops
// that never came, diagnosis deadlines, the off-lock work that finished —
// then the loop (job_controller_reconcile.cc) takes the next step.
#include "controller/job_controller.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/utf8.h"
#include "controller/describe.h"
#include "controller/hang_detector.h"
#include "controller/hang_locator.h"
#include "controller/heartbeat_detector.h"
#include "controller/off_lock_runner.h"

namespace trainguard {

using nlohmann::json;

void JobController::Tick() {
  tick_waiting_.store(true, std::memory_order_release);  // messages wait (OnMessage)
  std::lock_guard<std::mutex> lock(mu_);
  tick_waiting_.store(false, std::memory_order_release);
  Nanos now = clock_->MonotonicNanos();
  NoteWatchGap(now);
  TakeOffLockResults();
  if (!awaiting_explanation_.empty() && now - awaiting_since_mono_ > kExplainWait) {
    std::string id = awaiting_explanation_;
    awaiting_explanation_.clear();
    if (incident_) {
      incident_->AddLine({-1, id, "trainguard: the scheduler backend did not say within " + Seconds(kExplainWait) +
                                      " why node " + id + " was lost"});
    }
  }
  if (state_ != JobState::kRunning) next_hang_check_mono_ = 0;  // a new generation is checked in full
  if (state_ != JobState::kRunning && state_ != JobState::kStopping) next_silence_check_mono_ = 0;
  ProbeClocks();
  telemetry_.WriteGpuSeries();
  TakeTelemetry();  // what the ingest found since (OnMessage takes it at once, this is the backstop)
  if (now >= next_health_read_mono_) {  // cordons an operator made meanwhile, off the lock
    next_health_read_mono_ = now + config_.health_refresh;
    ReadHealthOffLock();
  }
  CheckResumeDeadline();
  switch (state_) {
    case JobState::kRunning:
      MaybeSendCheckpointPlan();
      CheckHeartbeats();
      // Judgements a burst of heartbeats left throttled (docs/sdc.md) are made here at the latest.
      CheckSdc(/*after_heartbeat=*/false);
      // Only once the earliest rank could be hung (reports move it:
      // UpdateRank): at 100,000 ranks, no pass over them every tick.
      if (state_ == JobState::kRunning && now >= next_hang_check_mono_) {
        // Most often the reports since the last look moved every rank on:
        // their deadlines, as the reports left them, say so in a light pass,
        // and the detector's full pass is not needed.
        if (const Nanos earliest = EarliestHangDeadline(); earliest > now) {
          next_hang_check_mono_ = earliest;
        } else if (std::optional<Finding> hang = DetectHang(View(), config_, &next_hang_check_mono_)) {
          AttachLocation(LocateHang(View()), &*hang);
          Fail(*hang);
        }
      }
      break;
    case JobState::kStopping:
      CheckHeartbeats();
      if (state_ == JobState::kStopping && now - stop_sent_mono_ > config_.stop_timeout) {
        for (auto& n : nodes_) {
          if (n.conn != 0 && n.group_rank >= 0 && n.stopped_generation != generation_) {
            NodeLost(&n, "did not report its ranks stopped within " + Seconds(config_.stop_timeout),
                     clock_->WallNanos());
          }
        }
      }
      break;
    case JobState::kDiagnosing:
      diagnosis_.CheckTimeouts(now);
      break;
    default: break;
  }
  // What only time changes while the job waits for nodes (the elastic
  // wait, cordons read from the store) is looked at once a second: a pass
  // over every node at every 50 ms tick of a 5-minute wait for a
  // replacement was most of a 100,000-GPU simulation. Messages (a node
  // registering) reconcile at once, as before.
  reconcile_from_tick_ = true;
  Reconcile();
  reconcile_from_tick_ = false;
}

void JobController::NoteWatchGap(Nanos now) {
  Nanos gap = last_tick_mono_ > 0 ? now - last_tick_mono_ : 0;
  last_tick_mono_ = now;
  if (config_.watch_gap_grace <= 0 || gap <= config_.watch_gap_grace) return;
  silence_from_mono_ = now;
  Emit(EventKind::kControllerStalled, "", -1, -1,
       "the controller did not run for " + Seconds(gap) +
           " (its process was frozen, starved or held up): every node's silence is counted afresh",
       json{{"gap_ms", gap / kMillisecond}}.dump(-1, ' ', false, kReplaceBadUtf8));
}

bool JobController::RefreshLiveness() {
  const Nanos now_mono = clock_->MonotonicNanos(), now_wall = clock_->WallNanos();
  const Nanos limit = config_.heartbeat_interval * config_.missed_heartbeats;
  bool any_silent = false;
  Nanos next = INT64_MAX;
  for (auto& n : nodes_) {
    if (n.link == nullptr) continue;
    Nanos heard = n.link->LastHeardMono();  // stamped on arrival by the transport
    if (heard > n.last_heartbeat_mono) {
      n.last_heartbeat_mono = heard;
      n.last_heartbeat_wall = now_wall - (now_mono - heard);
    }
    if (n.conn == 0 || n.group_rank < 0) continue;
    // A node's last word only moves later: none can pass the limit before the earliest of these.
    const Nanos from = std::max(n.last_heartbeat_mono, silence_from_mono_);
    if (now_mono - from > limit) {
      any_silent = true;
    } else {
      next = std::min(next, from + limit);
    }
  }
  // Silent nodes are judged now; look again at the next tick after that.
  next_silence_check_mono_ = any_silent ? now_mono : next;
  return any_silent;
}

Nanos JobController::EarliestHangDeadline() const {
  Nanos earliest = kNoHangDeadline;
  for (const auto& n : nodes_) {
    if (n.conn == 0 || n.group_rank < 0) continue;  // as View()
    earliest = std::min(earliest, n.hang_deadline);
  }
  return earliest;
}

JobView JobController::View() const {
  JobView view;
  view.now_mono = clock_->MonotonicNanos();
  view.now_wall = clock_->WallNanos();
  view.silence_from_mono = silence_from_mono_;
  for (const auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) view.nodes.push_back(&n);
  }
  return view;
}

void JobController::CheckHeartbeats() {
  // Nothing to look at before the earliest node could have been silent for
  // the limit: a node's last word only moves later.
  if (clock_->MonotonicNanos() < next_silence_check_mono_) return;
  // One pass over the nodes in the common case: every one was heard lately.
  if (!RefreshLiveness()) return;
  for (const Finding& f : DetectSilentNodes(View(), config_)) {
    if (state_ != JobState::kRunning && state_ != JobState::kStopping) return;
    Node* node = nodes_.ById(f.node);
    if (node != nullptr && node->conn != 0 && node->group_rank >= 0) {
      NodeLost(node, f.description, f.fault_wall);
    }
  }
}

}  // namespace trainguard
