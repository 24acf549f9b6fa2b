// NodeRegistry (node_registry.h).
#include "controller/node_registry.h"

#include <algorithm>

namespace trainguard {

JobNode& NodeRegistry::Add(JobNode node) {
  nodes_.push_back(std::move(node));
  return nodes_.back();
}

bool NodeRegistry::Remove(const std::string& id) {
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const JobNode& n) { return n.node_id == id; });
  if (it == nodes_.end()) return false;
  nodes_.erase(it);
  return true;
}

JobNode* NodeRegistry::ByConn(std::uint64_t conn) {
  if (conn == 0) return nullptr;
  if (auto it = conn_pos_.find(conn); it != conn_pos_.end()) {
    if (it->second < nodes_.size() && nodes_[it->second].conn == conn) return &nodes_[it->second];
    conn_pos_.erase(it);
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].conn == conn) {
      if (conn_pos_.size() > 2 * nodes_.size() + 64) conn_pos_.clear();  // closed connections' entries
      conn_pos_[conn] = i;
      return &nodes_[i];
    }
  }
  return nullptr;
}

const JobNode* NodeRegistry::ById(const std::string& id) const {
  if (auto it = id_pos_.find(id); it != id_pos_.end()) {
    if (it->second < nodes_.size() && nodes_[it->second].node_id == id) return &nodes_[it->second];
    id_pos_.erase(it);
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].node_id == id) {
      if (id_pos_.size() > 2 * nodes_.size() + 64) id_pos_.clear();
      id_pos_[id] = i;
      return &nodes_[i];
    }
  }
  return nullptr;
}

JobNode* NodeRegistry::ById(const std::string& id) {
  return const_cast<JobNode*>(static_cast<const NodeRegistry&>(*this).ById(id));
}

int NodeRegistry::IdleSpares() const {
  int idle = 0;
  for (const auto& n : nodes_) idle += (n.conn != 0 && !n.node_id.empty() && n.group_rank < 0) ? 1 : 0;
  return idle;
}

std::string NodeRegistry::NodeOfRank(int rank) const {
  for (const auto& n : nodes_) {
    if (n.ranks.count(rank)) return n.node_id;
  }
  return "";
}

}  // namespace trainguard
