// JobView: the read-only picture of a running job that detectors look at.
// The controller owns the data; a view holds pointers into it for one tick.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "proto/protocol.h"

namespace trainguard {

// One rank of the current generation, as last reported by its agent.
struct RankView {
  v1::RankStatus status;
  Nanos received_mono = 0;  // when the controller received `status`
  bool exited_ok = false;
  // HangDeadline under the lowest timeout, as of `status` (set with it by
  // the controller; 0: not known, so due at once).
  Nanos hang_deadline = 0;
};

// One node that holds a slot (group rank) and is connected.
struct NodeView {
  std::string node_id;
  int group_rank = -1;
  // When anything of the node last arrived (stamped by the transport on
  // arrival where it can: AgentLink::LastHeardMono).
  Nanos last_heartbeat_mono = 0;
  Nanos last_heartbeat_wall = 0;
  std::map<int, RankView> ranks;  // by global rank
  // No later than the earliest of its ranks' hang_deadline (exactly that
  // after each heartbeat; 0: not known): a pass over the nodes finds when
  // the job could next be hung without touching 100,000 ranks.
  Nanos hang_deadline = 0;
};

struct JobView {
  std::vector<const NodeView*> nodes;  // connected nodes holding a slot
  Nanos now_mono = 0;
  Nanos now_wall = 0;
  // Silence counts from no earlier than this: before it, the controller
  // itself was not running (JobConfig::watch_gap_grace).
  Nanos silence_from_mono = 0;
};

}  // namespace trainguard
