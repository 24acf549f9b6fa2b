// NodeRegistry: the nodes a job's controller knows — every agent that
// registered, with its session and what it last reported — and the indexes
// that find one by its connection or its id without a scan (every agent
// message looks its node up; a scan of 12,500 nodes for each would cost
// more than the message).
//
// It owns the nodes; they keep their registration order (spares are
// promoted in it). Pointers and references to nodes are valid until the
// next Add or Remove. Not thread-safe: the controller uses it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "controller/agent_link.h"
#include "controller/job_view.h"
#include "controller/straggler_cause.h"
#include "proto/protocol.h"

namespace trainguard {

// A node as the controller holds it: what detectors see (NodeView), its
// session, and what its agent said of it at registration and in its newest
// heartbeat.
struct JobNode : NodeView {
  std::uint64_t conn = 0;  // 0: not connected
  std::shared_ptr<AgentLink> link;
  std::string address;
  int free_port = 0;
  std::int64_t stopped_generation = -1;
  bool asked_for_slot = false;    // registered asking for its group rank
  bool runs_diagnostics = false;  // its agent answers RunDiagnostics
  int diag_port = 0;              // its diagnostics peer server (0: none)
  int memory_port = 0;            // its server of node memory copies (0: none)
  std::string rack;               // its top-of-rack switch ("" = none given)
  int standbys_ready = 0;         // from its newest heartbeat
  std::int64_t standby_rss_kb = 0;
  std::int64_t memory_checkpoint_bytes = 0;
  std::vector<v1::GpuHealth> gpus;  // from its latest heartbeat
  // GPU error increases its heartbeats showed (GpuErrorIncreases), with the
  // wall time: what corroborates a hardware verdict read from log lines.
  std::deque<std::pair<Nanos, std::string>> gpu_errors;  // the newest 16
  NodeCpu cpu;                      // from its latest heartbeat
  double tcp_retrans_pct = -1;      // from its latest heartbeat
  std::vector<v1::MountIo> mounts;  // from its latest heartbeat
};

class NodeRegistry {
 public:
  using iterator = std::vector<JobNode>::iterator;
  using const_iterator = std::vector<JobNode>::const_iterator;

  iterator begin() { return nodes_.begin(); }
  iterator end() { return nodes_.end(); }
  const_iterator begin() const { return nodes_.begin(); }
  const_iterator end() const { return nodes_.end(); }
  std::size_t size() const { return nodes_.size(); }
  JobNode& operator[](std::size_t i) { return nodes_[i]; }
  const JobNode& operator[](std::size_t i) const { return nodes_[i]; }

  // Appends a node (after every other); returns it.
  JobNode& Add(JobNode node);
  // Removes node `id`; false when there is none.
  bool Remove(const std::string& id);
  // The node on connection `conn` (null: none; 0 is no connection).
  JobNode* ByConn(std::uint64_t conn);
  // The node `id` (null: none).
  JobNode* ById(const std::string& id);
  const JobNode* ById(const std::string& id) const;
  // Connected registered nodes without a group rank: idle spares.
  int IdleSpares() const;
  // The node whose ranks include `rank` ("" when none).
  std::string NodeOfRank(int rank) const;

 private:
  std::vector<JobNode> nodes_;
  // Where a node was last found; checked before it is trusted (nodes shift
  // on the rare Remove), and dropped when they outnumber the nodes.
  mutable std::unordered_map<std::uint64_t, std::size_t> conn_pos_;
  mutable std::unordered_map<std::string, std::size_t> id_pos_;
};

}  // namespace trainguard
