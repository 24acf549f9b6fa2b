// FakeControllerLink: records what an Agent sends, for tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "agent/agent.h"

namespace trainguard {

class FakeControllerLink final : public ControllerLink {
 public:
  bool Send(const v1::AgentMessage& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_) return false;
    sent_.push_back(msg);
    cv_.notify_all();
    return true;
  }
  // While down, sends fail and Reconnect says no; Reconnect succeeds once up.
  void SetDown(bool down) {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = down;
  }
  bool Reconnect(Nanos timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++reconnect_calls_;
    return reconnectable_ && !down_;
  }
  void SetReconnectable(bool r) {
    std::lock_guard<std::mutex> lock(mu_);
    reconnectable_ = r;
  }
  int reconnect_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return reconnect_calls_;
  }
  // Abandon is recorded (the session's loss is the test's to report).
  void Abandon(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_.push_back(why);
  }
  std::vector<std::string> abandoned() {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_;
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
  bool down_ = false;
  bool reconnectable_ = false;
  int reconnect_calls_ = 0;
  std::vector<std::string> abandoned_;
  std::condition_variable cv_;
  std::vector<v1::AgentMessage> sent_;
};

}  // namespace trainguard
