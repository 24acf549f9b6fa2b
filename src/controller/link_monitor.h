// LinkMonitor: link health from the counters every heartbeat carries
// (agent/link_stats.h, NodeMetrics.links). Pure logic: readings and time in,
// observations out; the controller records them and acts on `flapping`.
//
// - A flap is a carrier loss: carrier_changes counts a loss and a return, so
//   a rise of 2 between two heartbeats is one flap even when both readings
//   found the link up (a flap shorter than a heartbeat).
// - `flapping`: a node's links flapped `flaps_to_evict` times within
//   `flap_window`; once per node. The controller treats it as a failure of
//   the node (attribution: network, hardware, evict).
// - `silent`: a node moved no bytes on any link for `silent_after` while
//   the median of the other nodes moved at least `busy_bytes_per_s`: its
//   traffic stopped while its peers' did not. Once until it moves again.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "controller/event_kind.h"
#include "controller/finding.h"
#include "proto/protocol.h"

namespace trainguard {

struct LinkPolicy {
  Nanos flap_window = 600 * kSecond;
  int flaps_to_evict = 3;
  Nanos silent_after = 10 * kSecond;
  double busy_bytes_per_s = 10e3;
};

struct LinkObservation {
  EventKind kind = EventKind::kLinkFlap;  // link_flap, link_down, link_up, link_flapping or link_silent
  std::string node;
  std::string link;     // "" for node-wide observations
  int flaps_in_window = 0;
  std::string message;  // one line
};

class LinkMonitor {
 public:
  explicit LinkMonitor(LinkPolicy policy = {}) : policy_(policy) {}

  // One heartbeat's readings of a node's links, at `now` (monotonic).
  std::vector<LinkObservation> Update(const std::string& node, const std::vector<v1::LinkStats>& links, Nanos now);
  // Bytes per second (rx + tx, every link) of the node between its last two readings; -1 if unknown.
  double BytesPerSecond(const std::string& node) const;
  // Packets dropped or in error per second (rx + tx, every link) between
  // its last two readings; -1 if unknown.
  double ErrorsPerSecond(const std::string& node) const;
  // Its links' carrier losses within the flap window.
  int FlapsInWindow(const std::string& node) const;
  // A node gone from the job (its counters start over when it comes back).
  void Forget(const std::string& node);

 private:
  struct NodeState {
    std::map<std::string, v1::LinkStats> last;  // by link name
    Nanos last_at = 0;
    double bytes_per_s = -1;
    double errors_per_s = -1;
    Nanos quiet_since = -1;                     // first reading that moved no bytes
    std::deque<Nanos> flaps;                    // within the window
    bool flapping_reported = false;
    bool silent_reported = false;
  };
  double MedianOfOthers(const std::string& node) const;

  const LinkPolicy policy_;
  std::map<std::string, NodeState> nodes_;
};

// The failure a "link_flapping" observation becomes: kind kLinkFlapping and
// the link monitor's verdict ("link-flapping": network, hardware,
// persistent) supporting the eviction of the node.
Finding LinkFlappingFailure(const LinkObservation& o, Nanos now_wall, const std::string& detail_json);

}  // namespace trainguard
