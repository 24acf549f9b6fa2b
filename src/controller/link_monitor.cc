#include "controller/link_monitor.h"

#include <algorithm>

namespace trainguard {

std::vector<LinkObservation> LinkMonitor::Update(const std::string& node, const std::vector<v1::LinkStats>& links,
                                                 Nanos now) {
  std::vector<LinkObservation> out;
  NodeState& s = nodes_[node];
  std::uint64_t moved = 0, errors = 0;
  bool comparable = s.last_at > 0;
  auto bad = [](const v1::LinkStats& x) { return x.rx_dropped() + x.tx_dropped() + x.rx_errors() + x.tx_errors(); };
  for (const auto& l : links) {
    auto prev = s.last.find(l.name());
    if (prev == s.last.end()) {
      comparable = false;  // a new link: no rate yet
      s.last[l.name()] = l;
      continue;
    }
    const v1::LinkStats& p = prev->second;
    const std::int64_t changes = l.carrier_changes() - p.carrier_changes();
    const std::uint64_t bytes_then = p.rx_bytes() + p.tx_bytes(), bytes_now = l.rx_bytes() + l.tx_bytes();
    if (changes < 0 || bytes_now < bytes_then || bad(l) < bad(p)) {  // counters started over (the interface was remade)
      comparable = false;
      prev->second = l;
      continue;
    }
    moved += bytes_now - bytes_then;
    errors += bad(l) - bad(p);
    if (p.up() && !l.up()) out.push_back({EventKind::kLinkDown, node, l.name(), 0, "node " + node + ": link " + l.name() + " is down"});
    if (!p.up() && l.up()) out.push_back({EventKind::kLinkUp, node, l.name(), 0, "node " + node + ": link " + l.name() + " is up again"});
    // Transitions alternate from the state of the last reading: from up, the
    // first is a loss (off, on, off, ...); from down, the first is a return.
    const int flaps = static_cast<int>(p.up() ? (changes + 1) / 2 : changes / 2);
    for (int i = 0; i < flaps; ++i) s.flaps.push_back(now);
    while (!s.flaps.empty() && now - s.flaps.front() > policy_.flap_window) s.flaps.pop_front();
    if (flaps > 0) {
      out.push_back({EventKind::kLinkFlap, node, l.name(), static_cast<int>(s.flaps.size()),
                     "node " + node + ": link " + l.name() + " lost its carrier " + std::to_string(flaps) +
                         " time(s) (" + std::to_string(s.flaps.size()) + " in the last " +
                         std::to_string(policy_.flap_window / kSecond) + " s)"});
    }
    if (!s.flapping_reported && policy_.flaps_to_evict > 0 &&
        static_cast<int>(s.flaps.size()) >= policy_.flaps_to_evict) {
      s.flapping_reported = true;
      out.push_back({EventKind::kLinkFlapping, node, l.name(), static_cast<int>(s.flaps.size()),
                     "node " + node + " link " + l.name() + " flapped " + std::to_string(s.flaps.size()) +
                         " times in " + std::to_string(policy_.flap_window / kSecond) + " s (carrier changes)"});
    }
    prev->second = l;
  }
  if (comparable && now > s.last_at) {
    s.bytes_per_s = static_cast<double>(moved) / (static_cast<double>(now - s.last_at) / kSecond);
    s.errors_per_s = static_cast<double>(errors) / (static_cast<double>(now - s.last_at) / kSecond);
    if (moved == 0) {
      if (s.quiet_since < 0) s.quiet_since = s.last_at;
      const double peers = MedianOfOthers(node);
      if (!s.silent_reported && now - s.quiet_since >= policy_.silent_after && peers >= policy_.busy_bytes_per_s) {
        s.silent_reported = true;
        char rate[32];
        std::snprintf(rate, sizeof(rate), "%.0f", peers);
        out.push_back({EventKind::kLinkSilent, node, "", 0,
                       "node " + node + " moved no bytes for " + std::to_string((now - s.quiet_since) / kSecond) +
                           " s while its peers moved a median " + rate + " B/s"});
      }
    } else {
      s.quiet_since = -1;
      s.silent_reported = false;
    }
  }
  s.last_at = now;
  return out;
}

double LinkMonitor::MedianOfOthers(const std::string& node) const {
  std::vector<double> rates;
  for (const auto& [id, s] : nodes_) {
    if (id != node && s.bytes_per_s >= 0) rates.push_back(s.bytes_per_s);
  }
  if (rates.empty()) return 0;
  std::sort(rates.begin(), rates.end());
  const std::size_t n = rates.size();
  return n % 2 == 1 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
}

double LinkMonitor::ErrorsPerSecond(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? -1 : it->second.errors_per_s;
}

int LinkMonitor::FlapsInWindow(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : static_cast<int>(it->second.flaps.size());
}

double LinkMonitor::BytesPerSecond(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? -1 : it->second.bytes_per_s;
}

void LinkMonitor::Forget(const std::string& node) { nodes_.erase(node); }

Finding LinkFlappingFailure(const LinkObservation& o, Nanos now_wall, const std::string& detail_json) {
  Finding f;
  f.kind = FindingKind::kLinkFlapping;
  f.description = o.message;
  f.node = o.node;
  f.fault_wall = now_wall;
  f.lines.push_back({-1, o.node, "trainguard: " + o.message});
  f.detail_json = detail_json;
  DetectorVerdict v;
  v.rule_id = "link-flapping";
  v.category = "network";
  v.description = "a node's network link kept losing its carrier (a flapping port, cable or transceiver)";
  v.evict_nodes = {o.node};
  f.verdict = v;
  return f;
}

}  // namespace trainguard
