// JobController, continued: the diagnosis rounds. The coordinator
// (diagnosis_coordinator.h) decides who is asked what and judges the
// answers; here its actions are carried out — orders sent, events and
// records written, failing nodes evicted — and the job goes on when a round
// is over: the first start, or the restart the round held up.
#include <nlohmann/json.hpp>

#include "controller/job_controller.h"
#include "diag/suite.h"

namespace trainguard {

void JobController::StartDiagnosis(DiagnosisPurpose why, const std::vector<std::string>& only) {
  const std::string label =
      why == DiagnosisPurpose::kPreflight
          ? std::string("preflight")
          : "incident " + std::to_string(incident_ ? incident_->number : incident_count_);
  DiagActions started = diagnosis_.Start(why, label, nodes_, only);
  SetState(JobState::kDiagnosing, label + ": diagnosing " + std::to_string(diagnosis_.round_size()) + " node(s)");
  CarryOutDiagnosis(std::move(started));
  // The orders go out from the loop (Reconcile).
}

void JobController::SendDiagnosisOrders() {
  CarryOutDiagnosis(diagnosis_.SendOrders(nodes_, clock_->MonotonicNanos()));
}

void JobController::HandleDiagnostics(Node* node, const v1::DiagnosticsResult& result) {
  if (result.free_port() > 0) node->free_port = result.free_port();
  CarryOutDiagnosis(diagnosis_.Answer(*node, result));
}

void JobController::MaybeFinishDiagnosis() {
  if (state_ != JobState::kDiagnosing) return;
  CarryOutDiagnosis(diagnosis_.Finish(nodes_, clock_->MonotonicNanos()));
}

void JobController::CarryOutDiagnosis(DiagActions actions) {
  for (DiagAction& action : actions) {
    std::visit(
        [this](auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<A, DiagOrder>) {
            Node* node = nodes_.ById(a.node);
            if (node != nullptr && node->conn != 0 && node->link) node->link->Send(a.msg);
          } else if constexpr (std::is_same_v<A, DiagEvent>) {
            Emit(a.kind, a.node, -1, -1, a.message, a.detail_json);
          } else if constexpr (std::is_same_v<A, DiagRecord>) {
            writer_->RecordDiagnostics({a.node, clock_->WallNanos(), DiagnoseModeName(diagnosis_.mode()),
                                        config_.job_id, a.figures_json});
          } else if constexpr (std::is_same_v<A, DiagEviction>) {
            Evict(a.node, a.why, a.evidence_json);
          } else {
            static_assert(std::is_same_v<A, DiagDone>);
            if (a.purpose == DiagnosisPurpose::kPreflight) {
              preflight_done_ = true;
              waiting_since_mono_ = clock_->MonotonicNanos();
              SetState(JobState::kStarting, "preflight diagnosis done");
            } else {
              Restart(pending_verdict_, /*diagnosed=*/true);
            }
          }
        },
        action);
  }
}

}  // namespace trainguard
