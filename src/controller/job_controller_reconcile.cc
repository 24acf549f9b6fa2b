// JobController::Reconcile: the controller's one loop.
//
// The desired state is the job's spec (config_: its nodes and ranks, the
// restart budget, the policy's knobs) and what the controller decided so far
// (state_, the generation, the open incident and its verdict). The observed
// state is what the agents reported (nodes_: who is connected, which group
// rank each holds, which stopped, their diagnostics) and what the store held
// when last read (node health). Each pass takes the step their difference
// calls for, and looks again until no step is left:
//
//   STARTING, RESTARTING  the group ranks filled (or an elastic job may go
//                         on without some) -> a preflight diagnosis or the
//                         next generation; waited past the rendezvous
//                         timeout -> the job fails
//   STOPPING              every rank stopped and every lost node explained
//                         -> the incident is blamed (off the lock), decided
//                         and carried out: a restart, a diagnosis, an end
//   DIAGNOSING            orders to nodes whose turn came; every answer in
//                         -> evictions, then the restart or the first start
//   RUNNING               nothing: the detectors' findings open incidents
//                         as they come (Fail), the loop takes them from there
//
// The loop is level-triggered: it looks at what is, not at what just
// happened. Message handlers and Tick only record what they observed (and
// findings: Fail); the loop runs after each of them, and after Start and
// Resume. So a normal tick, a controller restarted on the store and a
// standby taking over the lead go on through the same code, and no handler
// acts on a state it is halfway through changing.
#include <cstdio>

#include "controller/job_controller.h"

namespace trainguard {

bool JobController::ReconcileStep() {
  const JobState was = state_;
  switch (state_) {
    case JobState::kStarting:
    case JobState::kRestarting:
      MaybeStartGeneration();
      if ((state_ == JobState::kStarting || state_ == JobState::kRestarting) &&
          clock_->MonotonicNanos() - waiting_since_mono_ > config_.rendezvous_timeout) {
        GiveUpWaiting();
      }
      break;
    case JobState::kStopping:
      MaybeAllStopped();
      break;
    case JobState::kDiagnosing:
      SendDiagnosisOrders();
      MaybeFinishDiagnosis();
      break;
    case JobState::kRunning:
    case JobState::kSucceeded:
    case JobState::kFailed:
      break;
  }
  return state_ != was;
}

void JobController::Reconcile() {
  if (!started_) return;  // before Start or Resume there is no job to move
  // Each step moves the job along STARTING -> (DIAGNOSING ->) RUNNING or
  // STOPPING -> (DIAGNOSING ->) RESTARTING -> RUNNING | FAILED: a handful
  // settle it. More means two states hand the job back and forth.
  constexpr int kMaxSteps = 16;
  for (int step = 0; step < kMaxSteps; ++step) {
    if (!ReconcileStep()) return;
  }
  std::fprintf(stderr, "trainguard: warning: job %s did not settle in %d steps of its loop (now %s)\n",
               config_.job_id.c_str(), kMaxSteps, JobStateName(state_));
}

}  // namespace trainguard
