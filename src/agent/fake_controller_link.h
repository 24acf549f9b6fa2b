// FakeControllerLink: records what an Agent sends, for tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "agent/agent.h"

namespace trainguard {

class FakeControllerLink final : public ControllerLink {
 public:
  bool Send(const v1::AgentMessage& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back(msg);
    cv_.notify_all();
    return true;
  }
  // Waits (bounded) for a sent message matching `pred`; returns it or nullopt.
  std::optional<v1::AgentMessage> WaitFor(std::function<bool(const v1::AgentMessage&)> pred,
                                          std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<v1::AgentMessage> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const auto& m : sent_) {
        if (pred(m)) {
          found = m;
          return true;
        }
      }
      return false;
    });
    return found;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::AgentMessage> sent_;
};

}  // namespace trainguard
