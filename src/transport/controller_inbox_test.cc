// ControllerInbox on its own: a recording sink, no gRPC. Order per
// connection, heartbeats coalesced only while nothing of their node follows
// them, reads paused at the bound and resumed once drained, timings capped.
#include "transport/controller_inbox.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "controller/fake_agent_link.h"

namespace trainguard {
namespace {

class RecordingSink final : public InboxSink {
 public:
  void OnConnect(std::uint64_t conn, std::shared_ptr<AgentLink>) override { seen.push_back(Name(conn, "connect")); }
  void OnMessage(std::uint64_t conn, const v1::AgentMessage& msg, Nanos arrived) override {
    std::string what = msg.has_heartbeat()    ? "hb" + std::to_string(msg.heartbeat().sent_unix_ms())
                       : msg.has_timings()    ? "timings" + std::to_string(msg.timings().generation())
                       : msg.has_clock_echo() ? std::string("echo")
                                              : std::string("exit");
    seen.push_back(Name(conn, what));
    arrivals.push_back(arrived);
  }
  void OnDisconnect(std::uint64_t conn) override { seen.push_back(Name(conn, "disconnect")); }
  static std::string Name(std::uint64_t conn, const std::string& what) { return std::to_string(conn) + ":" + what; }
  std::vector<std::string> seen;
  std::vector<Nanos> arrivals;
};

v1::AgentMessage Heartbeat(int n) {
  v1::AgentMessage m;
  m.mutable_heartbeat()->set_sent_unix_ms(n);
  return m;
}

v1::AgentMessage Exit() {
  v1::AgentMessage m;
  m.mutable_rank_exited()->set_generation(0);
  return m;
}

TEST(ControllerInboxTest, KeepsEachConnectionsOrderAndCoalescesOnlyTrailingHeartbeats) {
  RecordingSink sink;
  ControllerInbox inbox(&sink);
  inbox.Connect(1, std::make_shared<FakeAgentLink>(), nullptr);
  inbox.Connect(2, std::make_shared<FakeAgentLink>(), nullptr);
  EXPECT_TRUE(inbox.Message(1, Heartbeat(1), 100));
  EXPECT_TRUE(inbox.Message(2, Heartbeat(1), 101));
  EXPECT_TRUE(inbox.Message(1, Heartbeat(2), 102));  // replaces node 1's queued one, newest arrival with it
  EXPECT_TRUE(inbox.Message(1, Exit(), 103));        // follows it: the next heartbeat queues after the exit
  EXPECT_TRUE(inbox.Message(1, Heartbeat(3), 104));
  inbox.Disconnect(2);
  inbox.DeliverQueued();
  EXPECT_EQ(sink.seen, (std::vector<std::string>{"1:connect", "2:connect", "1:hb2", "2:hb1", "1:exit", "1:hb3",
                                                 "2:disconnect"}));
  EXPECT_EQ(sink.arrivals, (std::vector<Nanos>{102, 101, 103, 104}));
  EXPECT_EQ(inbox.stats().heartbeats_coalesced, 1);
  // What was delivered takes no newer heartbeat; nothing follows a disconnect.
  EXPECT_TRUE(inbox.Message(1, Heartbeat(4), 105));
  EXPECT_TRUE(inbox.Message(2, Heartbeat(9), 106));
  inbox.DeliverQueued();
  EXPECT_EQ(sink.seen.back(), "1:hb4");
  EXPECT_EQ(sink.seen.size(), 8u);
}

TEST(ControllerInboxTest, PausesAConnectionAtTheBoundAndResumesItOnceHalfIsHandled) {
  RecordingSink sink;
  ControllerInbox inbox(&sink);
  int resumed = 0;
  inbox.Connect(1, std::make_shared<FakeAgentLink>(), [&] { ++resumed; });
  std::size_t accepted = 0;
  while (inbox.Message(1, Exit())) ++accepted;
  // The connect counts as one of the connection's queued items.
  EXPECT_EQ(accepted + 2, ControllerInbox::kMaxQueuedPerConn);
  EXPECT_EQ(inbox.stats().reads_paused, 1);
  EXPECT_EQ(resumed, 0);
  inbox.DeliverQueued();
  EXPECT_EQ(resumed, 1);
  EXPECT_EQ(sink.seen.size(), ControllerInbox::kMaxQueuedPerConn);
  EXPECT_TRUE(inbox.Message(1, Exit()));
}

TEST(ControllerInboxTest, DropsTimingsBeyondTheCapAndCountsThem) {
  RecordingSink sink;
  ControllerInbox inbox(&sink);
  v1::AgentMessage timings;
  timings.mutable_timings()->set_generation(0);
  // Many connections, so that no single one is paused first.
  const std::size_t conns = ControllerInbox::kMaxQueuedTimings / 10 + 1;
  for (std::size_t c = 1; c <= conns; ++c) inbox.Connect(c, std::make_shared<FakeAgentLink>(), nullptr);
  for (std::size_t c = 1; c <= conns; ++c) {
    for (int i = 0; i < 10; ++i) inbox.Message(c, timings);
  }
  EXPECT_EQ(inbox.stats().timings_dropped, static_cast<std::int64_t>(conns * 10 - ControllerInbox::kMaxQueuedTimings));
  inbox.DeliverQueued();
  std::size_t delivered = 0;
  for (const auto& s : sink.seen) delivered += s.find(":timings") != std::string::npos ? 1 : 0;
  EXPECT_EQ(delivered, ControllerInbox::kMaxQueuedTimings);
  EXPECT_TRUE(inbox.Message(1, timings));  // room again once delivered
  EXPECT_EQ(inbox.stats().timings_dropped, static_cast<std::int64_t>(conns * 10 - ControllerInbox::kMaxQueuedTimings));
}

v1::AgentMessage Timings(int generation) {
  v1::AgentMessage m;
  m.mutable_timings()->set_generation(generation);
  return m;
}

v1::AgentMessage Echo() {
  v1::AgentMessage m;
  m.mutable_clock_echo()->set_agent_unix_us(1);
  return m;
}

TEST(ControllerInboxTest, TelemetryGoesInItsOwnLaneInOrderAndCoalescesNoHeartbeatLess) {
  RecordingSink sink;
  ControllerInbox inbox(&sink);
  inbox.Connect(1, std::make_shared<FakeAgentLink>(), nullptr);
  EXPECT_TRUE(inbox.Message(1, Heartbeat(1)));
  EXPECT_TRUE(inbox.Message(1, Timings(1)));
  EXPECT_TRUE(inbox.Message(1, Echo()));
  EXPECT_TRUE(inbox.Message(1, Heartbeat(2)));  // replaces hb1: the telemetry is not in its lane
  EXPECT_TRUE(inbox.Message(1, Timings(2)));
  EXPECT_TRUE(inbox.Message(1, Exit()));
  inbox.DeliverQueued();
  EXPECT_EQ(sink.seen, (std::vector<std::string>{"1:connect", "1:hb2", "1:exit", "1:timings1", "1:echo", "1:timings2"}));
  EXPECT_EQ(inbox.stats().heartbeats_coalesced, 1);
  EXPECT_EQ(inbox.stats().queued, 0u);
}

// A sink whose handling of a rank's exit waits until the test opens it (a
// controller busy with the job): telemetry is delivered meanwhile.
class HeldSink final : public InboxSink {
 public:
  void OnConnect(std::uint64_t, std::shared_ptr<AgentLink>) override {}
  void OnMessage(std::uint64_t, const v1::AgentMessage& msg, Nanos) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (msg.has_timings() || msg.has_clock_echo()) {
      ++telemetry_;
      cv_.notify_all();
      return;
    }
    held_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void OnDisconnect(std::uint64_t) override {}
  bool WaitFor(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), done);
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool held_ = false;
  int telemetry_ = 0;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(ControllerInboxTest, TelemetryIsDeliveredWhileTheJobsLaneIsHeldUp) {
  HeldSink sink;
  ControllerInbox inbox(&sink);
  std::thread dispatcher([&] { inbox.Run(); });
  inbox.Connect(1, std::make_shared<FakeAgentLink>(), nullptr);
  inbox.Message(1, Exit());
  EXPECT_TRUE(sink.WaitFor([&] { return sink.held_; }));
  inbox.Message(1, Timings(0));
  inbox.Message(1, Echo());
  EXPECT_TRUE(sink.WaitFor([&] { return sink.telemetry_ == 2; })) << "the telemetry waited behind the job's lane";
  sink.Open();
  inbox.Stop();
  dispatcher.join();
}

}  // namespace
}  // namespace trainguard
