#include "controller/node_health_cache.h"

namespace trainguard {

NodeHealthCache::Rows NodeHealthCache::Index(std::vector<NodeHealth> rows) {
  Rows by_node;
  by_node.reserve(rows.size());
  for (auto& r : rows) {
    std::string node = r.node;
    by_node[std::move(node)] = std::move(r);
  }
  return by_node;
}

void NodeHealthCache::Replace(Rows rows, Nanos read_mono) {
  if (loaded_ && read_mono < read_mono_) return;
  rows_.swap(rows);
  loaded_ = true;
  read_mono_ = read_mono;
}

std::optional<NodeHealth> NodeHealthCache::Get(const std::string& node) const {
  if (!loaded_) return std::nullopt;
  auto it = rows_.find(node);
  if (it != rows_.end()) return it->second;
  NodeHealth none;
  none.node = node;
  return none;
}

int NodeHealthCache::SdcConfirmed(const std::string& node) const {
  auto it = sdc_confirmed_.find(node);
  return it == sdc_confirmed_.end() ? 0 : it->second;
}

}  // namespace trainguard
