// DiagnosisCoordinator (diagnosis_coordinator.h): which nodes are asked
// what in each stage of a round, their answers, and the verdict.
#include "controller/diagnosis_coordinator.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "diag/suite.h"

namespace trainguard {

using nlohmann::json;

DiagActions DiagnosisCoordinator::Start(DiagnosisPurpose purpose, const std::string& label,
                                        const NodeRegistry& nodes, const std::vector<std::string>& only) {
  purpose_ = purpose;
  mode_ = config_.diagnose != DiagnoseMode::kOff ? config_.diagnose : DiagnoseMode::kQuick;
  std::vector<const JobNode*> asked;
  for (const auto& n : nodes) {
    if (!only.empty() && std::find(only.begin(), only.end(), n.node_id) == only.end()) continue;
    if (n.conn != 0 && !n.node_id.empty() && n.runs_diagnostics) asked.push_back(&n);
  }
  std::sort(asked.begin(), asked.end(), [](const JobNode* a, const JobNode* b) {
    if ((a->group_rank < 0) != (b->group_rank < 0)) return a->group_rank >= 0;
    return a->group_rank != b->group_rank ? a->group_rank < b->group_rank : a->node_id < b->node_id;
  });
  std::vector<std::string> ids;
  for (const JobNode* n : asked) ids.push_back(n->node_id);
  round_.emplace(++rounds_, label, ids, config_.diag_parallelism, config_.diag_timeout);
  rack_seats_.clear();
  return {DiagEvent{
      EventKind::kDiagnosisStarted, "",
      "diagnosis round " + std::to_string(rounds_) + " (" + label + "): " + DiagnoseModeName(mode_) +
          " suite on " + std::to_string(ids.size()) + " node(s), " +
          (config_.diag_parallelism > 0 ? std::to_string(config_.diag_parallelism) + " at a time" : "all at once"),
      json{{"round", rounds_}, {"purpose", label}, {"nodes", ids}, {"mode", DiagnoseModeName(mode_)}}.dump(
          -1, ' ', false, kReplaceBadUtf8)}};
}

DiagActions DiagnosisCoordinator::SendOrders(const NodeRegistry& nodes, Nanos now) {
  DiagActions out;
  if (!round_) return out;
  for (const auto& id : round_->NextToAsk(now)) {
    const JobNode* node = nodes.ById(id);
    if (node == nullptr || node->conn == 0) {
      round_->NodeGone(id, "its agent went away before the diagnostics");
      continue;
    }
    v1::ControllerMessage msg;
    v1::RunDiagnostics* order = msg.mutable_run_diagnostics();
    order->set_round(round_->id());
    order->set_mode(DiagnoseModeName(mode_));
    switch (round_->stage()) {
      case DiagStage::kSuite:
        for (const auto& p : config_.diag_paths) order->add_paths(p);
        for (const auto& p : NetworkPeersOf(nodes, id)) order->add_peers(p);
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
    if (round_->stage() != DiagStage::kSuite && !config_.argv.empty()) {
      // The job's interpreter has the job's torch; else the agent's choice.
      const std::string& program = config_.argv[0];
      const std::string base = program.substr(program.rfind('/') + 1);
      if (base.rfind("python", 0) == 0) order->set_python(program);
    }
    out.push_back(DiagOrder{id, std::move(msg)});
  }
  return out;
}

std::vector<std::string> DiagnosisCoordinator::NetworkPeersOf(const NodeRegistry& nodes,
                                                              const std::string& node_id) const {
  std::vector<const JobNode*> ring;
  for (const auto& id : round_->nodes()) {
    const JobNode* n = nodes.ById(id);
    if (n != nullptr && n->conn != 0 && n->diag_port > 0) ring.push_back(n);
  }
  auto self = std::find_if(ring.begin(), ring.end(), [&](const JobNode* n) { return n->node_id == node_id; });
  if (self == ring.end() || ring.size() < 2) return {};
  std::vector<std::string> out;
  for (std::size_t j : RingNeighbours(ring.size(), static_cast<std::size_t>(self - ring.begin()))) {
    std::string peer = ring[j]->address + ":" + std::to_string(ring[j]->diag_port);
    if (std::find(out.begin(), out.end(), peer) == out.end()) out.push_back(peer);
  }
  return out;
}

bool DiagnosisCoordinator::HasGpus(const std::string& node_id) const {
  const std::vector<Figure>* figures = round_ ? round_->FiguresOf(node_id) : nullptr;
  if (figures == nullptr) return false;
  for (const auto& f : *figures) {
    if (f.name == "gpu_count" && f.error.empty() && f.value > 0) return true;
  }
  return false;
}

bool DiagnosisCoordinator::StartNextCollectiveStage(const NodeRegistry& registry) {
  std::vector<std::string> nodes;
  for (const auto& id : round_->nodes()) {
    const JobNode* n = registry.ById(id);
    if (n != nullptr && n->conn != 0 && round_->FiguresOf(id) != nullptr) nodes.push_back(id);
  }
  if (round_->stage() == DiagStage::kSuite) {
    // Each node's own stage: its ranks' all-to-all, and its GPUs' GEMM and copies.
    std::vector<std::vector<std::string>> alone;
    for (const auto& id : nodes) {
      if (config_.nproc_per_node >= 2 || HasGpus(id)) alone.push_back({id});
    }
    if (!alone.empty()) {
      round_->StartStage(DiagStage::kAllToAll, alone);
      return true;
    }
  }
  if (round_->stage() == DiagStage::kRackAllReduce) return false;
  // Racks in the round's order; the rack's first node serves the rendezvous
  // on its free port (no rank runs now; it reports a new one after).
  std::vector<std::pair<std::string, std::vector<std::string>>> racks;
  for (const auto& id : nodes) {
    const std::string& rack = registry.ById(id)->rack;
    if (rack.empty()) continue;  // no rack given: no rack to all-reduce with
    auto it = std::find_if(racks.begin(), racks.end(), [&](const auto& r) { return r.first == rack; });
    if (it == racks.end()) it = racks.insert(racks.end(), {rack, {}});
    it->second.push_back(id);
  }
  rack_seats_.clear();
  std::vector<std::vector<std::string>> groups;
  for (const auto& [rack, members] : racks) {
    if (members.size() < 2) continue;
    const JobNode* first = registry.ById(members[0]);
    const std::string master = first->address + ":" + std::to_string(first->free_port);
    const bool nccl = std::all_of(members.begin(), members.end(), [&](const std::string& m) { return HasGpus(m); });
    for (std::size_t i = 0; i < members.size(); ++i) {
      rack_seats_[members[i]] = {static_cast<int>(i), static_cast<int>(members.size()), master, nccl};
    }
    groups.push_back(members);
  }
  if (groups.empty()) return false;
  round_->StartStage(DiagStage::kRackAllReduce, groups);
  return true;
}

DiagActions DiagnosisCoordinator::Answer(const JobNode& node, const v1::DiagnosticsResult& result) {
  DiagActions out;
  if (!round_ || result.round() != round_->id()) return out;  // a stale round's answer
  auto figures = FiguresFromJson(result.figures_json());
  if (!figures.ok()) {
    round_->NodeGone(node.node_id, "its diagnostics are unreadable: " + figures.status().message());
    return out;
  }
  out.push_back(DiagRecord{node.node_id, result.figures_json()});
  json d = {{"round", result.round()},
            {"wall_ms", result.wall_ms()},
            {"stage", DiagStageName(round_->stage())},
            {"figures", json::parse(result.figures_json(), nullptr, false)}};
  std::string summary;
  for (const auto& f : *figures) {
    char value[64];
    std::snprintf(value, sizeof(value), "%.3g", f.value);
    summary += (summary.empty() ? "" : ", ") + f.name + " " + (f.error.empty() ? value : "error");
  }
  out.push_back(DiagEvent{
      EventKind::kDiagnostics, node.node_id,
      "node " + node.node_id + " diagnostics" +
          (round_->stage() == DiagStage::kSuite ? std::string()
                                                : std::string(" (") + DiagStageName(round_->stage()) + ")") +
          " in " + std::to_string(result.wall_ms()) + " ms: " + summary,
      d.dump(-1, ' ', false, kReplaceBadUtf8)});
  round_->Answer(node.node_id, std::move(figures.value()));
  return out;
}

void DiagnosisCoordinator::NodeGone(const std::string& node, const std::string& why) {
  if (round_) round_->NodeGone(node, why);
}

void DiagnosisCoordinator::CheckTimeouts(Nanos now) {
  if (round_) round_->CheckTimeouts(now);
}

DiagActions DiagnosisCoordinator::Finish(const NodeRegistry& nodes, Nanos now) {
  DiagActions out;
  // A stage whose nodes all failed already is over as soon as it starts: go on.
  while (round_ && round_->Done()) {
    auto again = round_->QueueConfirmations(JudgePolicy{});
    if (!again.empty()) {
      std::string names;
      for (const auto& n : again) names += (names.empty() ? "" : ", ") + n;
      out.push_back(DiagEvent{EventKind::kDiagnosisConfirming, "",
                              "diagnosis round " + std::to_string(round_->id()) +
                                  ": a speed below its floor or the nodes' median: measuring again before deciding (" + names + ")",
                              json{{"round", round_->id()}, {"nodes", again}}.dump(-1, ' ', false, kReplaceBadUtf8)});
      DiagActions orders = SendOrders(nodes, now);
      out.insert(out.end(), std::make_move_iterator(orders.begin()), std::make_move_iterator(orders.end()));
      return out;
    }
    if (!StartNextCollectiveStage(nodes)) {
      DiagActions verdict = Judge(nodes);
      out.insert(out.end(), std::make_move_iterator(verdict.begin()), std::make_move_iterator(verdict.end()));
      return out;
    }
    DiagActions orders = SendOrders(nodes, now);
    out.insert(out.end(), std::make_move_iterator(orders.begin()), std::make_move_iterator(orders.end()));
  }
  return out;
}

DiagActions DiagnosisCoordinator::Judge(const NodeRegistry& nodes) {
  DiagActions out;
  const DiagnosisRound round = std::move(*round_);
  round_.reset();
  rack_seats_.clear();
  json verdicts = json::array();
  std::vector<std::string> failing;
  for (const NodeVerdict& v : round.Judge(JudgePolicy{})) {
    verdicts.push_back({{"node", v.node}, {"healthy", v.healthy}, {"failures", v.failures}});
    const JobNode* node = nodes.ById(v.node);
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
    out.push_back(DiagEviction{v.node, "diagnostics (" + round.purpose() + "): " + why,
                               json{{"diagnosis_round", round.id()},
                                    {"purpose", round.purpose()},
                                    {"failures", v.failures},
                                    {"figures", figures}}
                                   .dump(-1, ' ', false, kReplaceBadUtf8)});
  }
  std::string failed_text;
  for (const auto& n : failing) failed_text += (failed_text.empty() ? "" : ", ") + n;
  out.push_back(DiagEvent{EventKind::kDiagnosis, "",
                          "diagnosis round " + std::to_string(round.id()) + " (" + round.purpose() + "): " +
                              (failing.empty() ? std::string("every node passed") : "failing: " + failed_text),
                          json{{"round", round.id()}, {"purpose", round.purpose()}, {"nodes", verdicts},
                               {"evicted", failing}}
                              .dump(-1, ' ', false, kReplaceBadUtf8)});
  out.push_back(DiagDone{purpose_});
  return out;
}

}  // namespace trainguard
