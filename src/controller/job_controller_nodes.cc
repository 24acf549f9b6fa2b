// JobController, continued: which nodes hold the job's group ranks — idle
// spares promoted into empty ones, an elastic job going on with fewer,
// evictions (which cordon the node in the store), and the link monitor's
// verdicts. The diagnosis rounds that find nodes to evict are in
// job_controller_diagnosis.cc; the state machine and the failure path in
// job_controller.cc.
#include <algorithm>
#include <set>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "controller/describe.h"
#include "controller/job_controller.h"

namespace trainguard {

using nlohmann::json;

void JobController::PromoteSpares() {
  // One pass, no allocation per node: every registration calls this (via
  // MaybeStartGeneration), and 12,500 nodes register at a job's start.
  std::vector<char> taken(config_.nnodes, 0);
  std::vector<Node*> idle;  // connected spares without a slot, in registration order
  for (auto& n : nodes_) {
    if (n.conn == 0 || n.node_id.empty()) continue;
    if (n.group_rank < 0) {
      idle.push_back(&n);
    } else if (n.group_rank < config_.nnodes) {
      taken[n.group_rank] = 1;
    }
  }
  std::size_t next = 0;
  for (int g = 0; g < config_.nnodes && next < idle.size(); ++g) {
    if (taken[g]) continue;
    // A slot whose holder is away (not connected) is free for a spare.
    for (auto& n : nodes_) {
      if (n.conn == 0 && n.group_rank == g) n.group_rank = -1;
    }
    Node* spare = idle[next++];
    spare->group_rank = g;
    taken[g] = 1;
    Emit(EventKind::kSparePromoted, spare->node_id, -1, -1,
         "spare node " + spare->node_id + " takes group rank " + std::to_string(g),
         json{{"group_rank", g}, {"idle_spares_left", nodes_.IdleSpares()}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
}

bool JobController::MayStartWithout(const std::vector<int>& empty) {
  const int present = config_.nnodes - static_cast<int>(empty.size());
  const Nanos waited = clock_->MonotonicNanos() - waiting_since_mono_;
  // Called at each registration: nothing here may cost O(empty slots)
  // unless it is said (12,500 nodes joining made that quadratic).
  bool awaited = false;
  for (int g : empty) {
    if (!given_up_slots_.count(g)) {
      awaited = true;
      break;
    }
  }
  if (present >= MinNodes() && present > 0 && (!awaited || waited >= config_.elastic_wait)) return true;
  // Nodes join one by one at the first start; say why only when a failure
  // left the job short, or when it is short of its minimum.
  if (state_ != JobState::kRestarting && !preflight_done_) return false;
  constexpr std::size_t kNamed = 20;
  std::string ranks;
  for (std::size_t i = 0; i < empty.size() && i < kNamed; ++i) {
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(empty[i]);
  }
  if (empty.size() > kNamed) ranks += ", ... (" + std::to_string(empty.size()) + " in all)";
  std::string why = "waiting for group rank(s) " + ranks + " (" + std::to_string(present) + " of " +
                    std::to_string(config_.nnodes) + " nodes present" +
                    (config_.spares > 0 && nodes_.IdleSpares() == 0 ? ", no spare left" : "") + "): ";
  if (present < MinNodes() || present == 0) {
    why += "the job needs " + std::to_string(MinNodes()) + " and fails if they have not joined within " +
           Seconds(config_.rendezvous_timeout);
  } else {
    why += "the job goes on with " + std::to_string(present) + " node(s) (--nnodes " +
           std::to_string(MinNodes()) + ":" + std::to_string(config_.nnodes) + ") unless a node joins within " +
           Seconds(config_.elastic_wait);
  }
  if (why != waiting_said_) {
    waiting_said_ = why;
    Emit(EventKind::kWaitingForNodes, "", -1, -1, why,
         json{{"empty_group_ranks", empty}, {"present", present}, {"min_nnodes", MinNodes()},
              {"max_nnodes", config_.nnodes}, {"idle_spares", nodes_.IdleSpares()}}
             .dump(-1, ' ', false, kReplaceBadUtf8));
  }
  return false;
}

void JobController::RenumberGroupRanks(std::vector<Node*>* slots) {
  std::vector<Node*> kept;
  for (Node* n : *slots) {
    if (n != nullptr) kept.push_back(n);
  }
  for (auto& n : nodes_) {
    if (n.conn == 0) n.group_rank = -1;  // a lost holder has no place to come back to
  }
  json moved = json::object();
  for (std::size_t i = 0; i < kept.size(); ++i) {
    if (kept[i]->group_rank != static_cast<int>(i)) moved[kept[i]->node_id] = {kept[i]->group_rank, i};
    kept[i]->group_rank = static_cast<int>(i);
  }
  given_up_slots_.clear();
  for (int g = static_cast<int>(kept.size()); g < config_.nnodes; ++g) given_up_slots_.insert(g);
  if (!moved.empty()) {
    Emit(EventKind::kGroupRanksRenumbered, "", -1, -1,
         "group ranks renumbered for " + std::to_string(kept.size()) + " node(s): " + moved.dump(),
         json{{"moved", moved}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  *slots = std::move(kept);
}

void JobController::Evict(const std::string& node_id, const std::string& why, const std::string& evidence) {
  Node* node = nodes_.ById(node_id);
  if (node == nullptr) return;
  const std::string by = "controller of job " + config_.job_id;
  json e = json::parse(evidence, nullptr, false);
  if (e.is_discarded() || !e.is_object()) e = json::object();
  Emit(EventKind::kNodeEvicted, node_id, -1, -1, "node " + node_id + " evicted and cordoned: " + why,
       json{{"reason", why}, {"by", by}, {"group_rank", node->group_rank}, {"evidence", e}}.dump(-1, ' ', false, kReplaceBadUtf8));
  const Nanos now = clock_->WallNanos();
  writer_->RecordNodeAction({node_id, now, "evict", by, why, config_.job_id, e.dump(-1, ' ', false, kReplaceBadUtf8)});
  writer_->SetNodeHealth({node_id, "cordoned", "evicted: " + why, config_.job_id, now});
  RemoveFromJob(node, why);
}

void JobController::RemoveFromJob(Node* node, const std::string& why) {
  if (node->link) {
    // Told why, the agent ends (instead of waiting for a controller that
    // it would take for restarted).
    v1::ControllerMessage bye;
    bye.mutable_shutdown()->set_reason("evicted from job " + config_.job_id + ": " + why);
    bye.mutable_shutdown()->set_exit_status(0);
    std::shared_ptr<AgentLink> link = node->link;
    telemetry_.Left(node->conn);
    node->conn = 0;
    node->link.reset();
    link->Send(bye);
    link->Close();
  }
  const int slot = node->group_rank;
  node->group_rank = -1;
  const bool replaced = provider_ != nullptr && provider_->EvictNode(node->node_id, why);
  if (slot >= 0 && !replaced) given_up_slots_.insert(slot);  // an elastic job need not wait for it
}

void JobController::EvictCordonedNodes() {
  // From the store's cordons as the incident's blame read them (off the
  // lock) and the controller's own queued ones: no store read here, at every
  // restart, under the lock.
  std::vector<std::string> cordoned;
  for (const auto& n : nodes_) {
    if (n.conn == 0 || n.group_rank < 0) continue;
    auto health = HealthOf(n.node_id);
    if (health.ok() && health->status == "cordoned") cordoned.push_back(n.node_id);
  }
  for (const auto& id : cordoned) {
    Node* node = nodes_.ById(id);
    Emit(EventKind::kNodeEvicted, id, -1, -1, "node " + id + " leaves the job: it was cordoned during the job",
         json{{"reason", "cordoned during the job"}, {"group_rank", node->group_rank}}.dump(-1, ' ', false, kReplaceBadUtf8));
    RemoveFromJob(node, "cordoned");
  }
}

void JobController::ObserveLinks(Node* node, const v1::NodeMetrics& metrics) {
  if (metrics.links_size() == 0) return;
  std::vector<v1::LinkStats> links(metrics.links().begin(), metrics.links().end());
  for (const LinkObservation& o : link_monitor_.Update(node->node_id, links, clock_->MonotonicNanos())) {
    Emit(o.kind, o.node, -1, -1, o.message,
         json{{"link", o.link}, {"flaps_in_window", o.flaps_in_window}}.dump(-1, ' ', false, kReplaceBadUtf8));
    if (o.kind != EventKind::kLinkFlapping) continue;
    if (node->group_rank < 0) {  // an idle spare: out before it takes a place
      Evict(node->node_id, o.message, json{{"link", o.link}, {"flaps_in_window", o.flaps_in_window}}.dump());
      return;  // `node` may no longer hold a session
    }
    if (state_ != JobState::kRunning) continue;  // a restart on the way evicts by the attribution below
    Fail(LinkFlappingFailure(
        o, clock_->WallNanos(),
        json{{"link", o.link}, {"flaps_in_window", o.flaps_in_window}}.dump(-1, ' ', false, kReplaceBadUtf8)));
  }
}

}  // namespace trainguard
