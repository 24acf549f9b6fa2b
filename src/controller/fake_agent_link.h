// FakeAgentLink and FakeNodeProvider: test doubles for JobController's
// transport and scheduler backend. They record what the controller sent.
#pragma once

#include <string>
#include <vector>

#include "controller/agent_link.h"
#include "controller/node_provider.h"

namespace trainguard {

class FakeAgentLink final : public AgentLink {
 public:
  void Send(const v1::ControllerMessage& msg) override { sent.push_back(msg); }
  void Close() override { closed = true; }
  Nanos LastHeardMono() const override { return heard; }

  // The last message of a kind, or nullptr.
  const v1::ControllerMessage* Last(v1::ControllerMessage::KindCase kind) const {
    for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
      if (it->kind_case() == kind) return &*it;
    }
    return nullptr;
  }
  int Count(v1::ControllerMessage::KindCase kind) const {
    int n = 0;
    for (const auto& m : sent) n += m.kind_case() == kind ? 1 : 0;
    return n;
  }

  std::vector<v1::ControllerMessage> sent;
  Nanos heard = 0;  // LastHeardMono: what a transport stamped on arrival
  bool closed = false;
};

class FakeNodeProvider final : public NodeProvider {
 public:
  void ReplaceNode(const std::string& node_id, const std::string& reason) override {
    replaced.push_back(node_id);
  }
  bool EvictNode(const std::string& node_id, const std::string& reason) override {
    evicted.push_back(node_id);
    return replaces_evicted;
  }
  LossExplanation ExplainLoss(const std::string& node_id) override { return explanation; }
  std::vector<std::string> replaced;
  std::vector<std::string> evicted;
  LossExplanation explanation;  // what ExplainLoss says of any node
  bool replaces_evicted = true;
};

}  // namespace trainguard
