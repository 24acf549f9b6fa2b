// SdcMonitor (sdc_monitor.h), continued: what a successor controller (a
// restart in place, a standby's takeover) rebuilds from the job's events —
// the generation's replica sets, the rollback bound, the script's checkpoint
// directories, the newest verified commit and the suspicion under replay.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "controller/sdc_monitor.h"

namespace trainguard {

using nlohmann::json;

namespace {

// The suspicion as recorded; nullopt when the record is not one (a newer
// controller's, a damaged row): the successor then starts without it.
template <typename T>
std::optional<T> Field(const json& d, const char* name) {
  if (!d.contains(name)) return std::nullopt;
  try {
    return d.at(name).get<T>();
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

bool SdcMonitor::Replays(EventKind kind) {
  switch (kind) {
    case EventKind::kGenerationStarted:
    case EventKind::kReplicaSets:
    case EventKind::kCheckpointVerified:
    case EventKind::kReplicaDivergence:
    case EventKind::kNumericAnomaly:
    case EventKind::kResumeBoundCleared:
    case EventKind::kTorchCheckpointDir:
    case EventKind::kSdcSuspicion:
      return true;
    default:
      return false;
  }
}

void SdcMonitor::Replay(EventKind kind, std::int64_t generation, std::int64_t step, const json& detail) {
  switch (kind) {
    case EventKind::kGenerationStarted:
      generation_ = generation;
      replayed_sets_.clear();
      replayed_agreed_ = -1;
      break;
    case EventKind::kReplicaSets:
      if (generation == generation_) {
        replayed_sets_ = ReplicaSetsFromJson(detail.value("sets", json())).value_or(std::vector<std::vector<int>>{});
        replayed_agreed_ = Field<std::int64_t>(detail, "agreed_through").value_or(-1);
      }
      break;
    case EventKind::kCheckpointVerified:
      verified_commit_ = std::max(verified_commit_, step);
      break;
    case EventKind::kReplicaDivergence:
    case EventKind::kNumericAnomaly:
      // A rollback's bound outlives the controller: forgetting it would let
      // the next restart load a checkpoint saved after the fault (docs/sdc.md).
      if (auto bound = Field<std::int64_t>(detail, "resume_at_most")) {
        resume_at_most_ = *bound;
        resume_at_most_why_ = Field<std::string>(detail, "resume_why").value_or(resume_at_most_why_);
        bad_through_ = Field<std::int64_t>(detail, "bad_through").value_or(bad_through_);
        bound_generation_ = generation;
      }
      break;
    case EventKind::kResumeBoundCleared:
      resume_at_most_ = -1;
      resume_at_most_why_.clear();
      bad_through_ = -1;
      break;
    case EventKind::kTorchCheckpointDir:
      if (auto dir = Field<std::string>(detail, "dir"); dir && !dir->empty() && torch_checkpoint_dirs_.size() < 16) {
        torch_checkpoint_dirs_.insert(*dir);
      }
      break;
    case EventKind::kSdcSuspicion: {
      Suspicion s;
      const std::string what = Field<std::string>(detail, "what").value_or("");
      s.what = what == "numeric" ? SdcWhat::kNumeric : what == "disagreement" ? SdcWhat::kDisagreement : SdcWhat::kNone;
      s.stage = Field<int>(detail, "stage").value_or(0);
      if (s.what == SdcWhat::kNone || s.stage < 1 || s.stage > 2) {
        suspicion_ = Suspicion{};
        break;
      }
      s.step = Field<std::int64_t>(detail, "step").value_or(-1);
      s.last_agreed_step = Field<std::int64_t>(detail, "last_agreed_step").value_or(-1);
      s.ranks = Field<std::vector<int>>(detail, "ranks").value_or(std::vector<int>{});
      s.nodes = Field<std::vector<std::string>>(detail, "nodes").value_or(std::vector<std::string>{});
      s.moved = Field<std::vector<std::string>>(detail, "moved").value_or(std::vector<std::string>{});
      s.from_generation = Field<std::int64_t>(detail, "from_generation").value_or(generation);
      for (const auto& [r, v] : Field<std::map<std::string, std::string>>(detail, "values").value_or(
               std::map<std::string, std::string>{})) {
        s.values[std::atoi(r.c_str())] = std::strtoull(v.c_str(), nullptr, 16);
      }
      for (const auto& [r, d] : Field<std::map<std::string, std::string>>(detail, "devices").value_or(
               std::map<std::string, std::string>{})) {
        s.devices[std::atoi(r.c_str())] = d;
      }
      if (s.step < 0 || s.ranks.empty()) {
        std::fprintf(stderr, "trainguard: warning: the recorded SDC suspicion %s is incomplete; it is not replayed\n",
                     detail.dump().c_str());
        suspicion_ = Suspicion{};
        break;
      }
      suspicion_ = std::move(s);
      break;
    }
    default:
      break;
  }
}

void SdcMonitor::FinishReplay(std::int64_t generation, int world) {
  StartGeneration(generation, world);
  if (replayed_sets_.empty()) return;
  if (!replicas_.Restore(replayed_sets_, replayed_agreed_)) {
    json sets = replayed_sets_;
    std::fprintf(stderr, "trainguard: warning: the recorded replica sets %s do not fit generation %lld; "
                         "they are learned again\n", sets.dump().c_str(), static_cast<long long>(generation));
  }
}

}  // namespace trainguard
