// The agent's session with its controller: registering (again, after the
// controller restarted), sending, keeping what must not be lost while the
// controller is away, and reconnecting. docs/protocol.md ("Reconnecting").
#include <unistd.h>

#include <cstdio>

#include "agent/agent.h"
#include "agent/process.h"
#include "proto/sanitize.h"

namespace trainguard {

namespace {

// Messages a controller must get even when it was away while they happened.
bool KeptWhileAway(const v1::AgentMessage& m) {
  return m.has_rank_exited() || m.has_started() || m.has_stopped() || m.has_log_alert() ||
         m.has_diagnostics();
}

constexpr std::size_t kOutboxSize = 1000;

}  // namespace

void Agent::Send(const v1::AgentMessage& msg) {
  // Rank output, kernel lines, error files and stacks are bytes; the wire
  // wants UTF-8 (a bad string would end the session: "node lost").
  v1::AgentMessage clean = msg;
  SanitizeStrings(&clean);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (away_) {
      if (KeptWhileAway(clean) && outbox_.size() < kOutboxSize) outbox_.push_back(std::move(clean));
      return;
    }
  }
  // A session that broke before the loop heard of it: what must not be lost
  // waits for the next one.
  if (!link_->Send(clean) && KeptWhileAway(clean)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (outbox_.size() < kOutboxSize) outbox_.push_back(std::move(clean));
  }
}

v1::AgentMessage Agent::MakeRegister(bool resume) {
  v1::AgentMessage reg;
  v1::Register* r = reg.mutable_register_();
  r->set_protocol_version(config_.protocol_version);
  r->set_node_id(config_.node_id);
  r->set_job_secret(config_.job_secret);
  r->set_hostname(config_.hostname);
  r->set_address(config_.address);
  r->set_free_port(FindFreePort());
  r->set_pid(getpid());
  r->set_runs_diagnostics(true);
  r->set_rack(config_.rack);
  if (peer_server_ != nullptr && peer_server_->port() > 0) r->set_diag_port(peer_server_->port());
  r->set_memory_port(MemoryPort());
  if (config_.preferred_group_rank >= 0) r->set_preferred_group_rank(config_.preferred_group_rank);
  if (resume && generation_ >= 0 && !ranks_.empty()) {
    r->set_resume_generation(generation_);
    r->set_resume_group_rank(group_rank_);
    for (const auto& rank : ranks_) *r->add_resume_ranks() = Describe(*rank);
  }
  return reg;
}

bool Agent::StartReconnecting(const std::string& why) {
  if (config_.reconnect_window <= 0 || quitting_.load()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (away_) return true;  // already trying
    away_ = true;
  }
  if (reconnector_.joinable()) reconnector_.join();
  std::fprintf(stderr,
               "trainguard agent %s: lost the controller (%s); its ranks keep running while it tries to "
               "reconnect for up to %.0f s\n",
               config_.node_id.c_str(), why.c_str(), static_cast<double>(config_.reconnect_window) / kSecond);
  const Nanos deadline = clock_->MonotonicNanos() + config_.reconnect_window;
  reconnector_ = std::thread([this, deadline, why] {
    while (!quitting_.load()) {
      const Nanos left = deadline - clock_->MonotonicNanos();
      if (left <= 0) break;
      const Nanos tried = clock_->MonotonicNanos();
      if (link_->Reconnect(std::min<Nanos>(left, 1 * kSecond))) {
        std::lock_guard<std::mutex> lock(mu_);
        commands_.push_back(Command{std::nullopt, "", true, false});
        cv_.notify_all();
        return;
      }
      // A link that refuses at once is not asked in a tight loop.
      if (clock_->MonotonicNanos() - tried < 100 * kMillisecond) usleep(200000);
    }
    std::lock_guard<std::mutex> lock(mu_);
    commands_.push_back(Command{std::nullopt, why + "; it did not come back within " +
                                                  std::to_string(config_.reconnect_window / kSecond) + " s",
                                false, true});
    cv_.notify_all();
  });
  return true;
}

}  // namespace trainguard
