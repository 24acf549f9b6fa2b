// JobController and its SDC monitor (sdc_monitor.h, docs/sdc.md): the facts
// the monitor reads of the job, and what it decided carried out in order —
// events, the nodes' SDC history, a node returned, a verified step
// announced, a failure.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "common/json_text.h"
#include "controller/job_controller.h"

namespace trainguard {

using nlohmann::json;

// The job as the monitor sees it, under the controller's lock.
class JobController::SdcFacts final : public SdcJob {
 public:
  explicit SdcFacts(const JobController& job) : job_(job) {}
  std::string NodeOfRank(int rank) const override {
    for (const auto& n : job_.nodes_) {
      if (n.group_rank >= 0 && n.ranks.count(rank)) return n.node_id;
    }
    return "";
  }
  bool HasNode(const std::string& node) const override { return job_.nodes_.ById(node) != nullptr; }
  std::int64_t MaxStep() const override { return job_.MaxStep(); }
  int SdcHistory(const std::string& node) const override { return job_.health_.SdcConfirmed(node); }

 private:
  const JobController& job_;
};

void JobController::CheckSdc(bool after_heartbeat) {
  if (state_ != JobState::kRunning) return;
  SdcActions actions;
  sdc_.Check(SdcFacts(*this), clock_->MonotonicNanos(), clock_->WallNanos(), after_heartbeat, &actions);
  CarryOutSdc(std::move(actions));
}

void JobController::CarryOutSdc(SdcActions actions) {
  for (SdcAction& action : actions) {
    std::visit(
        [this](auto& a) {
          using A = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<A, SdcEvent>) {
            Emit(a.kind, a.node, a.rank, a.step, a.message, a.detail_json);
          } else if constexpr (std::is_same_v<A, SdcNodeRecord>) {
            RecordSdc(a);
          } else if constexpr (std::is_same_v<A, SdcReturnNode>) {
            ReturnNode(a.node, a.why);
          } else if constexpr (std::is_same_v<A, SdcReadHistory>) {
            ReadSdcHistoryOffLock(a.nodes);
          } else if constexpr (std::is_same_v<A, SdcAnnounceVerified>) {
            v1::ControllerMessage msg;
            msg.mutable_verified()->set_step(a.through);
            for (auto& n : nodes_) {
              if (n.conn != 0 && n.group_rank >= 0) n.link->Send(msg);
            }
          } else {
            static_assert(std::is_same_v<A, SdcFailure>);
            Fail(a.finding);
          }
        },
        action);
  }
}

void JobController::RecordSdc(const SdcNodeRecord& record) {
  const Nanos now = clock_->WallNanos();
  for (const auto& n : record.nodes) {
    writer_->RecordNodeAction({n, now, record.confirmed ? std::string("sdc-confirmed") : std::string("sdc-suspect"),
                               "controller of job " + config_.job_id,
                               record.confirmed
                                   ? std::string("silent data corruption confirmed by replay")
                                   : std::string("silent data corruption suspected, not reproduced on replay (transient)"),
                               config_.job_id, record.evidence_json});
  }
}

void JobController::ReturnNode(const std::string& node, const std::string& why) {
  const Nanos now = clock_->WallNanos();
  const std::string by = "controller of job " + config_.job_id;
  writer_->RecordNodeAction({node, now, "uncordon", by, why, config_.job_id, "{}"});
  writer_->SetNodeHealth({node, "ok", "returned: " + why, config_.job_id, now});
  Emit(EventKind::kNodeReturned, node, -1, -1, "node " + node + " uncordoned: " + why,
       json{{"reason", why}, {"by", by}}.dump(-1, ' ', false, kReplaceBadUtf8));
}

}  // namespace trainguard
