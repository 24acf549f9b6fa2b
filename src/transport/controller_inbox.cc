#include "transport/controller_inbox.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace trainguard {

void ControllerInbox::Connect(std::uint64_t conn, std::shared_ptr<AgentLink> link, std::function<void()> resume) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn& c = conns_[conn];
  c.resume = std::move(resume);
  c.queued++;
  queue_.push_back({What::kConnect, conn, {}, std::move(link)});
  stats_.max_queued = std::max(stats_.max_queued, queue_.size());
  cv_.notify_one();
}

bool ControllerInbox::Message(std::uint64_t conn, v1::AgentMessage msg, Nanos arrived_mono) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(conn);
  if (it == conns_.end() || it->second.gone) return true;  // nothing can follow a disconnect
  Conn& c = it->second;
  const bool heartbeat = msg.has_heartbeat();
  if (heartbeat && c.heartbeat != nullptr) {
    c.heartbeat->msg = std::move(msg);  // still the last of its node: the newer status replaces it
    c.heartbeat->arrived_mono = arrived_mono;
    stats_.heartbeats_coalesced++;
    return true;
  }
  if (msg.has_timings()) {
    if (queued_timings_ >= kMaxQueuedTimings) {
      stats_.timings_dropped++;
      return true;
    }
    queued_timings_++;
  }
  const bool telemetry = msg.has_timings() || msg.has_clock_echo();
  std::deque<Item>& lane = telemetry ? telemetry_ : queue_;
  lane.push_back({What::kMessage, conn, std::move(msg), nullptr, arrived_mono});
  stats_.max_queued = std::max(stats_.max_queued, queue_.size() + telemetry_.size());
  c.queued++;
  if (telemetry) {
    telemetry_cv_.notify_one();
  } else if (heartbeat) {
    c.heartbeat = &queue_.back();  // a deque's elements stay put while it grows at the back
    heartbeat_conns_.push_back(conn);
  } else {
    c.heartbeat = nullptr;
  }
  if (!telemetry) cv_.notify_one();
  if (c.queued >= kMaxQueuedPerConn) {
    c.paused = true;
    stats_.reads_paused++;
    return false;
  }
  return true;
}

void ControllerInbox::Disconnect(std::uint64_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn& c = conns_[conn];
  c.gone = true;
  c.heartbeat = nullptr;
  c.queued++;
  queue_.push_back({What::kDisconnect, conn, {}, nullptr});
  stats_.max_queued = std::max(stats_.max_queued, queue_.size());
  cv_.notify_one();
}

bool ControllerInbox::DeliverBatch(std::deque<Item>* queue, std::unique_lock<std::mutex>* lock) {
  if (queue->empty()) return false;
  std::deque<Item> batch;
  batch.swap(*queue);
  if (queue == &queue_) {
    // What is being delivered can no longer take a newer heartbeat.
    for (std::uint64_t conn : heartbeat_conns_) {
      auto it = conns_.find(conn);
      if (it != conns_.end()) it->second.heartbeat = nullptr;
    }
    heartbeat_conns_.clear();
  }
  lock->unlock();
  std::size_t timings = 0;
  for (Item& item : batch) {
    switch (item.what) {
      case What::kConnect: sink_->OnConnect(item.conn, std::move(item.link)); break;
      case What::kMessage:
        timings += item.msg.has_timings() ? 1 : 0;
        sink_->OnMessage(item.conn, item.msg, item.arrived_mono);
        break;
      case What::kDisconnect: sink_->OnDisconnect(item.conn); break;
    }
  }
  lock->lock();
  stats_.delivered += static_cast<std::int64_t>(batch.size());
  queued_timings_ -= timings;
  std::vector<std::function<void()>> resumes;
  for (const Item& item : batch) {
    auto it = conns_.find(item.conn);
    if (it == conns_.end()) continue;
    Conn& c = it->second;
    c.queued--;
    if (item.what == What::kDisconnect) {
      conns_.erase(it);
    } else if (c.paused && c.queued <= kMaxQueuedPerConn / 2) {
      c.paused = false;
      if (c.resume) resumes.push_back(c.resume);
    }
  }
  lock->unlock();
  for (auto& resume : resumes) resume();
  lock->lock();
  return true;
}

void ControllerInbox::Run() {
  std::thread telemetry([this] { RunTelemetry(); });
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (!DeliverBatch(&queue_, &lock) && stopping_) break;
    }
  }
  telemetry.join();
}

void ControllerInbox::RunTelemetry() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    telemetry_cv_.wait(lock, [&] { return stopping_ || !telemetry_.empty(); });
    if (!DeliverBatch(&telemetry_, &lock) && stopping_) return;
  }
}

void ControllerInbox::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  telemetry_cv_.notify_all();
}

void ControllerInbox::DeliverQueued() {
  std::unique_lock<std::mutex> lock(mu_);
  DeliverBatch(&queue_, &lock);
  DeliverBatch(&telemetry_, &lock);
}

ControllerInbox::Stats ControllerInbox::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.queued = queue_.size() + telemetry_.size();
  return s;
}

}  // namespace trainguard
