// JobController::Tick: what time alone decides — silent nodes
// (heartbeat_detector), hangs (hang_detector, located by hang_locator), stops
// that never came, diagnosis deadlines, and a rendezvous that never completed.
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

namespace trainguard {

using nlohmann::json;

void JobController::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  Nanos now = clock_->MonotonicNanos();
  ProbeClocks();
  CheckResumeDeadline();
  switch (state_) {
    case JobState::kRunning:
      CheckHeartbeats();
      if (state_ == JobState::kRunning) {
        if (std::optional<Finding> hang = DetectHang(View(), config_)) {
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
      if (diagnosis_) {
        diagnosis_->CheckTimeouts(now);
        SendDiagnosisOrders();
        MaybeFinishDiagnosis();
      }
      break;
    case JobState::kStarting:
    case JobState::kRestarting:
      if (MinNodes() < config_.nnodes) MaybeStartGeneration();  // the elastic wait may be over
      if ((state_ == JobState::kStarting || state_ == JobState::kRestarting) &&
          now - waiting_since_mono_ > config_.rendezvous_timeout) {
        int present = 0;
        for (const auto& n : nodes_) present += (n.conn != 0 && n.group_rank >= 0) ? 1 : 0;
        std::string evicted;
        for (const auto& n : nodes_) {
          if (n.conn == 0 && n.group_rank < 0) evicted += (evicted.empty() ? "" : ", ") + n.node_id;
        }
        Finish(JobState::kFailed, "job " + config_.job_id + " FAILED: only " +
                                      std::to_string(present) + " of " +
                                      std::to_string(config_.nnodes) + " nodes" +
                                      (MinNodes() < config_.nnodes
                                           ? " (at least " + std::to_string(MinNodes()) + " needed)"
                                           : std::string()) +
                                      " joined within " +
                                      Seconds(config_.rendezvous_timeout) +
                                      (evicted.empty() ? "" : "; gone: " + evicted) +
                                      (config_.spares > 0 ? "; no spare left" : ""));
      }
      break;
    default: break;
  }
}

JobView JobController::View() const {
  JobView view;
  view.now_mono = clock_->MonotonicNanos();
  view.now_wall = clock_->WallNanos();
  for (const auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) view.nodes.push_back(&n);
  }
  return view;
}

void JobController::CheckHeartbeats() {
  for (const Finding& f : DetectSilentNodes(View(), config_)) {
    if (state_ != JobState::kRunning && state_ != JobState::kStopping) return;
    Node* node = NodeById(f.node);
    if (node != nullptr && node->conn != 0 && node->group_rank >= 0) {
      NodeLost(node, f.description, f.fault_wall);
    }
  }
}

}  // namespace trainguard
