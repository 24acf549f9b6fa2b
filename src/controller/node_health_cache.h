// NodeHealthCache: what the store says of nodes (cordoned, watched,
// suspect, cleared; confirmed silent data corruption) as last read. The
// controller reads the store off its lock (at its start, every
// JobConfig::health_refresh, and with each incident's blame) and decides, under its
// lock, from this copy, with its own writes still queued in the store writer
// in front of it (StoreWriter::PendingHealth): at 12,500 nodes registering,
// a store read per registration under the lock was the job's bottleneck,
// and a store away for a minute must not hold every decision up.
//
// Pure data; not thread-safe (the controller's lock).
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "store/event_store.h"

namespace trainguard {

class NodeHealthCache {
 public:
  using Rows = std::unordered_map<std::string, NodeHealth>;
  // The store's list (ListNodeHealth) by node: built off the lock.
  static Rows Index(std::vector<NodeHealth> rows);
  // Every node's row as read at `read_mono` (a swap: constant time under the
  // lock); an older read than the one held is ignored.
  void Replace(Rows rows, Nanos read_mono);
  bool loaded() const { return loaded_; }
  Nanos read_mono() const { return read_mono_; }
  // The node's row; status "" when the store has none; nullopt before the
  // first read.
  std::optional<NodeHealth> Get(const std::string& node) const;

  // Confirmed silent data corruptions of a node (its `sdc-confirmed` node
  // actions), read for the nodes a suspicion names; 0 when not read.
  void SetSdcConfirmed(const std::string& node, int count) { sdc_confirmed_[node] = count; }
  int SdcConfirmed(const std::string& node) const;

 private:
  Rows rows_;
  std::unordered_map<std::string, int> sdc_confirmed_;
  bool loaded_ = false;
  Nanos read_mono_ = 0;
};

}  // namespace trainguard
