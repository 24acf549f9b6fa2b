// JobController, continued: the diagnosis rounds (controller/
// diagnosis_round.h) — which nodes are asked what in each stage (the suite
// with its network ring, each node's all-to-all and GPU figures, each rack's
// all-reduce), their answers recorded, and the verdict: failing nodes
// evicted, then the restart or the first start goes on.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "controller/job_controller.h"
#include "diag/suite.h"

namespace trainguard {

using nlohmann::json;

void JobController::StartDiagnosis(DiagnosisPurpose why) {
  diagnosis_purpose_ = why;
  const std::string purpose =
      why == DiagnosisPurpose::kPreflight
          ? std::string("preflight")
          : "incident " + std::to_string(incident_ ? incident_->number : incident_count_);
  // Job nodes in group-rank order, then the spares: a bad spare is found
  // before it takes a place.
  std::vector<const Node*> asked;
  for (const auto& n : nodes_) {
    if (n.conn != 0 && !n.node_id.empty() && n.runs_diagnostics) asked.push_back(&n);
  }
  std::sort(asked.begin(), asked.end(), [](const Node* a, const Node* b) {
    if ((a->group_rank < 0) != (b->group_rank < 0)) return a->group_rank >= 0;
    return a->group_rank != b->group_rank ? a->group_rank < b->group_rank : a->node_id < b->node_id;
  });
  std::vector<std::string> ids;
  for (const Node* n : asked) ids.push_back(n->node_id);
  diagnosis_.emplace(++diagnosis_rounds_, purpose, ids, config_.diag_parallelism, config_.diag_timeout);
  SetState(JobState::kDiagnosing, purpose + ": diagnosing " + std::to_string(ids.size()) + " node(s)");
  Emit(EventKind::kDiagnosisStarted, "", -1, -1,
       "diagnosis round " + std::to_string(diagnosis_rounds_) + " (" + purpose + "): " + DiagnoseModeName(config_.diagnose) +
           " suite on " + std::to_string(ids.size()) + " node(s), " +
           (config_.diag_parallelism > 0 ? std::to_string(config_.diag_parallelism) + " at a time" : "all at once"),
       json{{"round", diagnosis_rounds_}, {"purpose", purpose}, {"nodes", ids}, {"mode", DiagnoseModeName(config_.diagnose)}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
  // The orders go out from the loop (Reconcile).
}

void JobController::SendDiagnosisOrders() {
  if (!diagnosis_) return;
  for (const auto& id : diagnosis_->NextToAsk(clock_->MonotonicNanos())) {
    Node* node = nodes_.ById(id);
    if (node == nullptr || node->conn == 0) {
      diagnosis_->NodeGone(id, "its agent went away before the diagnostics");
      continue;
    }
    v1::ControllerMessage msg;
    v1::RunDiagnostics* order = msg.mutable_run_diagnostics();
    order->set_round(diagnosis_->id());
    order->set_mode(DiagnoseModeName(config_.diagnose));
    switch (diagnosis_->stage()) {
      case DiagStage::kSuite:
        for (const auto& p : config_.diag_paths) order->add_paths(p);
        for (const auto& p : NetworkPeersOf(id)) order->add_peers(p);
        break;
      case DiagStage::kAllToAll:
        order->set_collective(true);
        order->set_local_ranks(config_.nproc_per_node);
        order->set_gpu(HasGpus(id));
        order->set_nccl(HasGpus(id));
        break;
      case DiagStage::kRackAllReduce: {
        order->set_collective(true);
        const RackSeat& seat = rack_seats_[id];
        order->set_rack_rank(seat.rank);
        order->set_rack_size(seat.size);
        order->set_rack_master(seat.master);
        order->set_nccl(seat.nccl);
        break;
      }
    }
    if (diagnosis_->stage() != DiagStage::kSuite && !config_.argv.empty()) {
      // The job's interpreter has the job's torch; else the agent's choice.
      const std::string& program = config_.argv[0];
      const std::string base = program.substr(program.rfind('/') + 1);
      if (base.rfind("python", 0) == 0) order->set_python(program);
    }
    node->link->Send(msg);
  }
}

std::vector<std::string> JobController::NetworkPeersOf(const std::string& node_id) {
  std::vector<const Node*> ring;
  for (const auto& id : diagnosis_->nodes()) {
    const Node* n = nodes_.ById(id);
    if (n != nullptr && n->conn != 0 && n->diag_port > 0) ring.push_back(n);
  }
  auto self = std::find_if(ring.begin(), ring.end(), [&](const Node* n) { return n->node_id == node_id; });
  if (self == ring.end() || ring.size() < 2) return {};
  std::vector<std::string> out;
  for (std::size_t j : RingNeighbours(ring.size(), static_cast<std::size_t>(self - ring.begin()))) {
    std::string peer = ring[j]->address + ":" + std::to_string(ring[j]->diag_port);
    if (std::find(out.begin(), out.end(), peer) == out.end()) out.push_back(peer);
  }
  return out;
}

bool JobController::HasGpus(const std::string& node_id) const {
  const std::vector<Figure>* figures = diagnosis_ ? diagnosis_->FiguresOf(node_id) : nullptr;
  if (figures == nullptr) return false;
  for (const auto& f : *figures) {
    if (f.name == "gpu_count" && f.error.empty() && f.value > 0) return true;
  }
  return false;
}

bool JobController::StartNextCollectiveStage() {
  std::vector<std::string> nodes;
  for (const auto& id : diagnosis_->nodes()) {
    const Node* n = nodes_.ById(id);
    if (n != nullptr && n->conn != 0 && diagnosis_->FiguresOf(id) != nullptr) nodes.push_back(id);
  }
  if (diagnosis_->stage() == DiagStage::kSuite) {
    // Each node's own stage: its ranks' all-to-all, and its GPUs' GEMM and copies.
    std::vector<std::vector<std::string>> alone;
    for (const auto& id : nodes) {
      if (config_.nproc_per_node >= 2 || HasGpus(id)) alone.push_back({id});
    }
    if (!alone.empty()) {
      diagnosis_->StartStage(DiagStage::kAllToAll, alone);
      return true;
    }
  }
  if (diagnosis_->stage() == DiagStage::kRackAllReduce) return false;
  // Racks in the round's order; the rack's first node serves the rendezvous
  // on its free port (no rank runs now; it reports a new one after).
  std::vector<std::pair<std::string, std::vector<std::string>>> racks;
  for (const auto& id : nodes) {
    const std::string& rack = nodes_.ById(id)->rack;
    if (rack.empty()) continue;  // no rack given: no rack to all-reduce with
    auto it = std::find_if(racks.begin(), racks.end(), [&](const auto& r) { return r.first == rack; });
    if (it == racks.end()) it = racks.insert(racks.end(), {rack, {}});
    it->second.push_back(id);
  }
  rack_seats_.clear();
  std::vector<std::vector<std::string>> groups;
  for (const auto& [rack, members] : racks) {
    if (members.size() < 2) continue;
    const Node* first = nodes_.ById(members[0]);
    const std::string master = first->address + ":" + std::to_string(first->free_port);
    const bool nccl = std::all_of(members.begin(), members.end(), [&](const std::string& m) { return HasGpus(m); });
    for (std::size_t i = 0; i < members.size(); ++i) {
      rack_seats_[members[i]] = {static_cast<int>(i), static_cast<int>(members.size()), master, nccl};
    }
    groups.push_back(members);
  }
  if (groups.empty()) return false;
  diagnosis_->StartStage(DiagStage::kRackAllReduce, groups);
  return true;
}

void JobController::HandleDiagnostics(Node* node, const v1::DiagnosticsResult& result) {
  if (!diagnosis_ || result.round() != diagnosis_->id()) return;  // a stale round's answer
  if (result.free_port() > 0) node->free_port = result.free_port();
  auto figures = FiguresFromJson(result.figures_json());
  if (!figures.ok()) {
    diagnosis_->NodeGone(node->node_id, "its diagnostics are unreadable: " + figures.status().message());
  } else {
    writer_->RecordDiagnostics(
        {node->node_id, clock_->WallNanos(), DiagnoseModeName(config_.diagnose), config_.job_id, result.figures_json()});
    json d = {{"round", result.round()}, {"wall_ms", result.wall_ms()},
              {"stage", DiagStageName(diagnosis_->stage())},
              {"figures", json::parse(result.figures_json(), nullptr, false)}};
    std::string summary;
    for (const auto& f : *figures) {
      char value[64];
      std::snprintf(value, sizeof(value), "%.3g", f.value);
      summary += (summary.empty() ? "" : ", ") + f.name + " " + (f.error.empty() ? value : "error");
    }
    Emit(EventKind::kDiagnostics, node->node_id, -1, -1,
         "node " + node->node_id + " diagnostics" +
             (diagnosis_->stage() == DiagStage::kSuite ? std::string() : std::string(" (") + DiagStageName(diagnosis_->stage()) + ")") +
             " in " + std::to_string(result.wall_ms()) + " ms: " + summary,
         d.dump(-1, ' ', false, kReplaceBadUtf8));
    diagnosis_->Answer(node->node_id, std::move(figures.value()));
  }
}

void JobController::MaybeFinishDiagnosis() {
  if (!diagnosis_ || !diagnosis_->Done() || state_ != JobState::kDiagnosing) return;
  auto again = diagnosis_->QueueConfirmations(JudgePolicy{});
  if (!again.empty()) {
    std::string names;
    for (const auto& n : again) names += (names.empty() ? "" : ", ") + n;
    Emit(EventKind::kDiagnosisConfirming, "", -1, -1,
         "diagnosis round " + std::to_string(diagnosis_->id()) +
             ": below the nodes' median: measuring again before deciding (" + names + ")",
         json{{"round", diagnosis_->id()}, {"nodes", again}}.dump(-1, ' ', false, kReplaceBadUtf8));
    SendDiagnosisOrders();
    return;
  }
  if (StartNextCollectiveStage()) {
    SendDiagnosisOrders();
    MaybeFinishDiagnosis();  // every node of the stage may have failed already
    return;
  }
  const DiagnosisRound round = *diagnosis_;
  diagnosis_.reset();
  json nodes = json::array();
  std::vector<std::string> failing;
  for (const NodeVerdict& v : round.Judge(JudgePolicy{})) {
    nodes.push_back({{"node", v.node}, {"healthy", v.healthy}, {"failures", v.failures}});
    const Node* node = nodes_.ById(v.node);
    if (v.healthy || node == nullptr || node->conn == 0) continue;  // gone: NodeLost has said so
    failing.push_back(v.node);
    json figures = json::array();
    for (const auto& f : v.figures) {
      json j = {{"name", f.figure.name}, {"value", f.figure.value}, {"ok", f.failure.empty()}};
      if (f.peers > 0) j["median"] = f.median;
      if (!f.figure.error.empty()) j["error"] = f.figure.error;
      figures.push_back(std::move(j));
    }
    std::string why;
    for (const auto& line : v.failures) why += (why.empty() ? "" : "; ") + line;
    Evict(v.node, "diagnostics (" + round.purpose() + "): " + why,
          json{{"diagnosis_round", round.id()}, {"purpose", round.purpose()}, {"failures", v.failures},
               {"figures", figures}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  std::string failed_text;
  for (const auto& n : failing) failed_text += (failed_text.empty() ? "" : ", ") + n;
  Emit(EventKind::kDiagnosis, "", -1, -1,
       "diagnosis round " + std::to_string(round.id()) + " (" + round.purpose() + "): " +
           (failing.empty() ? std::string("every node passed") : "failing: " + failed_text),
       json{{"round", round.id()}, {"purpose", round.purpose()}, {"nodes", nodes}, {"evicted", failing}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
  if (diagnosis_purpose_ == DiagnosisPurpose::kPreflight) {
    preflight_done_ = true;
    waiting_since_mono_ = clock_->MonotonicNanos();
    SetState(JobState::kStarting, "preflight diagnosis done");
  } else {
    Restart(pending_verdict_, /*diagnosed=*/true);
  }
}

}  // namespace trainguard
