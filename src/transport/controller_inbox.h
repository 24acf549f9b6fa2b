// ControllerInbox: what the transport's threads receive from agents, handed
// in order to a dispatcher thread that feeds the JobController; step
// timings and clock echoes go to a second one (the telemetry lane), which
// feeds the controller's telemetry ingest without its lock
// (controller/telemetry_ingest.h). So the job's messages never wait behind
// the heaviest traffic, and the two use two cores.
//
// The transport's threads never wait for the controller's lock: they stamp
// a message's arrival (AgentLink::LastHeardMono, which the heartbeat detector
// reads) and queue it here. So a busy controller delays what it does with a
// message, never the proof that the node is alive.
//
// Bounded: a node's heartbeats are coalesced while the dispatcher is behind
// (the newest replaces a queued one that nothing from its node follows, as a
// heartbeat carries the full status, not a change); a node with
// kMaxQueuedPerConn other messages queued is not read from (`Message`
// returns false) until the dispatcher has taken half of them, when its
// `resume` callback asks the transport to read again; Timings beyond
// kMaxQueuedTimings are dropped and counted (the store writer drops them
// too when full: they are sampled detail, never the job's decisions).
//
// Per connection, the order of connect, messages and disconnect is kept,
// and so is the order of its telemetry; telemetry is not ordered against
// the rest (timings come after a node's registration was handled, as only a
// Start, sent after it, makes ranks that time steps; a disconnect handled
// before the node's last timings leaves them unstored).
// Thread safety: Connect/Message/Disconnect from any thread; Run on one.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "controller/agent_link.h"
#include "proto/protocol.h"

namespace trainguard {

// Where the dispatcher delivers (the JobController's three entry points).
class InboxSink {
 public:
  virtual ~InboxSink() = default;
  virtual void OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink> link) = 0;
  // `arrived_mono`: when the transport received it.
  virtual void OnMessage(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived_mono) = 0;
  virtual void OnDisconnect(std::uint64_t conn) = 0;
};

class ControllerInbox {
 public:
  static constexpr std::size_t kMaxQueuedPerConn = 64;
  static constexpr std::size_t kMaxQueuedTimings = 20000;

  struct Stats {
    std::int64_t delivered = 0;            // messages handed to the sink
    std::int64_t heartbeats_coalesced = 0;  // replaced by a newer one before delivery
    std::int64_t timings_dropped = 0;
    std::int64_t reads_paused = 0;         // times a connection was not read from
    std::size_t queued = 0;                // now
    std::size_t max_queued = 0;            // the most at once
  };

  explicit ControllerInbox(InboxSink* sink) : sink_(sink) {}

  // `resume` is called (from the dispatcher, without the inbox's lock) when
  // a connection that was paused may be read from again.
  void Connect(std::uint64_t conn, std::shared_ptr<AgentLink> link, std::function<void()> resume);
  // False: the connection is paused; read nothing more from it until its
  // `resume` is called.
  bool Message(std::uint64_t conn, v1::AgentMessage msg, Nanos arrived_mono = 0);
  void Disconnect(std::uint64_t conn);

  // Delivers until Stop, then what is queued; the telemetry lane runs on a
  // thread of its own meanwhile. Call on one thread.
  void Run();
  void Stop();
  // Delivers what is queued now on the calling thread, the job's lane then
  // the telemetry lane (tests).
  void DeliverQueued();
  Stats stats() const;

 private:
  enum class What { kConnect, kMessage, kDisconnect };
  struct Item {
    What what;
    std::uint64_t conn;
    v1::AgentMessage msg;
    std::shared_ptr<AgentLink> link;
    Nanos arrived_mono = 0;
  };
  struct Conn {
    std::size_t queued = 0;       // messages of it in queue_ (heartbeats included)
    Item* heartbeat = nullptr;    // its queued heartbeat that nothing of it follows
    bool paused = false;
    bool gone = false;            // Disconnect queued
    std::function<void()> resume;
  };
  // Takes `queue` (queue_ or telemetry_) and delivers it; true if
  // something was delivered.
  bool DeliverBatch(std::deque<Item>* queue, std::unique_lock<std::mutex>* lock);
  // Delivers the telemetry lane until Stop, then what is queued in it.
  void RunTelemetry();

  InboxSink* const sink_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::deque<Item> telemetry_;  // timings and clock echoes
  std::condition_variable telemetry_cv_;
  std::unordered_map<std::uint64_t, Conn> conns_;
  std::vector<std::uint64_t> heartbeat_conns_;  // conns whose `heartbeat` may be set
  std::size_t queued_timings_ = 0;
  bool stopping_ = false;
  Stats stats_;
};

}  // namespace trainguard
