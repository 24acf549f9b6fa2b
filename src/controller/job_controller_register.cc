// JobController, continued: an agent registering. The checks it must pass
// (protocol, the job's secret, a node id, a job that has not ended, a node
// that is not cordoned, an id not used by another host), a node of the
// running generation taken back after the controller's restart
// (job_controller_resume.cc), a stale session replaced, and which group rank
// the node takes. The state machine and the failure path are in
// job_controller.cc; which nodes hold the group ranks in
// job_controller_nodes.cc.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/job_secret.h"
#include "common/json_text.h"
#include "controller/job_controller.h"

namespace trainguard {

using nlohmann::json;

void JobController::HandleRegister(std::uint64_t conn, const v1::Register& reg) {
  // The connection's link, kept since it connected.
  auto pending = pending_links_.find(conn);
  if (pending == pending_links_.end()) return;
  std::shared_ptr<AgentLink> link = std::move(pending->second);
  pending_links_.erase(pending);

  v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_protocol_version(kProtocolVersion);
  welcome.mutable_welcome()->set_job_id(config_.job_id);
  // With standbys: an agent that hears nothing for three clock probes
  // turns to the next controller (a paused or cut-off leader).
  if (config_.lead_epoch > 0) {
    welcome.mutable_welcome()->set_silence_ms(static_cast<int>(3 * config_.clock_probe_interval / kMillisecond));
  }
  welcome.mutable_welcome()->set_heartbeat_interval_ms(
      static_cast<int>(config_.heartbeat_interval / kMillisecond));
  auto refuse = [&](const std::string& why) {
    welcome.mutable_welcome()->set_error(why);
    link->Send(welcome);
    link->Close();
    Emit(EventKind::kAgentRefused, reg.node_id(), -1, -1, "agent " + reg.node_id() + " refused: " + why);
    std::fprintf(stderr, "trainguard: agent %s (%s) refused: %s\n", reg.node_id().c_str(), reg.hostname().c_str(),
                 why.c_str());
  };
  if (reg.protocol_version() != kProtocolVersion) {
    refuse("protocol version mismatch: agent speaks " + std::to_string(reg.protocol_version()) +
           ", controller speaks " + std::to_string(kProtocolVersion));
    return;
  }
  if (!config_.agent_secret.empty() && !SecretMatches(config_.agent_secret, reg.job_secret())) {
    refuse(std::string(reg.job_secret().empty() ? "it showed no job secret" : "its job secret is wrong") +
           ": start it with --secret-file naming a file that holds the job's secret");
    return;
  }
  if (reg.node_id().empty()) {
    refuse("agent sent an empty node id");
    return;
  }
  if (state_ == JobState::kSucceeded || state_ == JobState::kFailed) {
    refuse(std::string("job already ") + JobStateName(state_));
    return;
  }
  // After a restart of the controller: a node of the running generation
  // that is back with its ranks (job_controller_resume.cc).
  if (ResumeNode(conn, link, reg, &welcome)) return;
  if (auto health = HealthOf(reg.node_id()); health.ok() && health->status == "cordoned") {
    refuse("node " + reg.node_id() + " is cordoned (" + health->reason +
           (health->job_id.empty() ? "" : ", by job " + health->job_id) +
           "); `trainguard uncordon " + reg.node_id() + "` returns it");
    return;
  }
  Node* node = nodes_.ById(reg.node_id());
  if (node != nullptr && node->conn != 0 && !node->address.empty() && node->address != reg.address()) {
    // Not a restarted agent: another host that goes by the same name.
    refuse("node id " + reg.node_id() + " is in use by the agent at " + node->address +
           "; give every host its own node id (--node-id)");
    return;
  }
  if (node != nullptr && node->conn != 0) {
    // The same node registers again while we still hold a connection: the old
    // session is stale (the agent restarted); its ranks are gone.
    std::shared_ptr<AgentLink> old = node->link;
    telemetry_.Left(node->conn);
    node->conn = 0;
    node->link.reset();
    old->Close();
    if (node->group_rank >= 0 && state_ == JobState::kRunning) {
      NodeLost(node, "re-registered with a new session", clock_->WallNanos());
    }
    node = nodes_.ById(reg.node_id());
  }
  if (node == nullptr) {
    node = &nodes_.Add(Node{});
    node->node_id = reg.node_id();
  }
  // A node takes the slot it asks for if free, else its old slot if free,
  // else the lowest free one.
  // Flags, not a set: every registration looks at every node (12,500 of them).
  std::vector<bool> taken_flags(static_cast<std::size_t>(std::max(config_.nnodes, 0)), false);
  int taken_count = 0;
  for (const auto& n : nodes_) {
    if (&n != node && n.group_rank >= 0 && n.group_rank < config_.nnodes && !taken_flags[n.group_rank]) {
      taken_flags[n.group_rank] = true;
      ++taken_count;
    }
  }
  struct {
    std::vector<bool>* flags;
    int* count;
    bool count_of(int g) const { return g >= 0 && g < static_cast<int>(flags->size()) && (*flags)[g]; }
    std::size_t size() const { return static_cast<std::size_t>(*count); }
    void erase(int g) {
      if (count_of(g)) {
        (*flags)[g] = false;
        --*count;
      }
    }
    void insert(int g) {
      if (g >= 0 && g < static_cast<int>(flags->size()) && !(*flags)[g]) {
        (*flags)[g] = true;
        ++*count;
      }
    }
  } taken{&taken_flags, &taken_count};
  const int wanted = reg.has_preferred_group_rank() ? reg.preferred_group_rank() : -1;
  node->asked_for_slot = wanted >= 0 && wanted < config_.nnodes;
  // Before the first start a slot is only a label: a node that asks for it
  // outranks one that took it as the lowest free (with spares, agents race
  // to register), if the latter has somewhere to go.
  Node* bumped = nullptr;
  if (node->asked_for_slot && taken.count_of(wanted) && state_ == JobState::kStarting) {
    for (auto& n : nodes_) {
      if (&n != node && n.group_rank == wanted && !n.asked_for_slot) bumped = &n;
    }
    bool elsewhere = static_cast<int>(taken.size()) < config_.nnodes || nodes_.IdleSpares() < config_.spares;
    if (bumped != nullptr && elsewhere) {
      taken.erase(wanted);
    } else {
      bumped = nullptr;
    }
  }
  if (node->asked_for_slot && !taken.count_of(wanted)) node->group_rank = wanted;
  if (node->group_rank < 0 || taken.count_of(node->group_rank)) {
    node->group_rank = -1;
    for (int g = 0; g < config_.nnodes; ++g) {
      if (!taken.count_of(g)) {
        node->group_rank = g;
        break;
      }
    }
  }
  if (bumped != nullptr) {
    taken.insert(node->group_rank);
    bumped->group_rank = -1;
    for (int g = 0; g < config_.nnodes; ++g) {
      if (!taken.count_of(g)) {
        bumped->group_rank = g;
        break;
      }
    }
    Emit(EventKind::kNodeReassigned, bumped->node_id, -1, -1,
         "node " + bumped->node_id + " gives group rank " + std::to_string(wanted) + " to " + reg.node_id() +
             ", which asked for it, and is now " +
             (bumped->group_rank < 0 ? std::string("an idle spare") : "group rank " + std::to_string(bumped->group_rank)),
         json{{"group_rank", bumped->group_rank}, {"spare", bumped->group_rank < 0}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  const bool spare = node->group_rank < 0;
  if (spare && nodes_.IdleSpares() >= config_.spares) {
    std::string id = node->node_id;
    nodes_.Remove(id);
    refuse("job already has all " + std::to_string(config_.nnodes) + " nodes" +
           (config_.spares > 0 ? " and " + std::to_string(config_.spares) + " spare(s)" : ""));
    return;
  }
  node->conn = conn;
  telemetry_.Joined(conn, node->node_id);
  node->link = link;
  node->runs_diagnostics = reg.runs_diagnostics();
  node->diag_port = reg.diag_port();
  node->memory_port = reg.memory_port();
  node->rack = reg.rack();
  node->address = reg.address();
  node->free_port = reg.free_port();
  node->last_heartbeat_mono = clock_->MonotonicNanos();
  node->last_heartbeat_wall = clock_->WallNanos();
  node->stopped_generation = generation_;  // a fresh agent runs no ranks
  node->ranks.clear();
  if (rules_ != nullptr) welcome.mutable_welcome()->set_scan_rules(scan_rules_json_);
  link->Send(welcome);
  json d = {{"hostname", reg.hostname()}, {"address", reg.address()},
            {"agent_pid", reg.pid()},     {"group_rank", node->group_rank}, {"spare", spare}};
  Emit(EventKind::kNodeRegistered, node->node_id, -1, -1,
       "node " + node->node_id + " (" + reg.hostname() + ", " + reg.address() + ") registered " +
           (spare ? std::string("as an idle spare") : "as group rank " + std::to_string(node->group_rank)),
       d.dump(-1, ' ', false, kReplaceBadUtf8));
  auto health = HealthOf(node->node_id);
  if (health.ok() && health->status == "suspect") {
    Emit(EventKind::kNodeSuspect, node->node_id, -1, -1,
         "warning: node " + node->node_id + " is marked suspect since job " + health->job_id +
             ": " + health->reason,
         json{{"reason", health->reason}, {"marked_by_job", health->job_id}}.dump(-1, ' ', false, kReplaceBadUtf8));
  }
  // A spare that joins a running job gets its warm standbys made at once.
  if (spare && spare_standby_.has_prepare_standby()) link->Send(spare_standby_);
}

}  // namespace trainguard
