#include "alerts/webhook_sender.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "alerts/alert_publisher.h"
#include "testing/wait_until.h"

namespace trainguard {
namespace {

// A real HTTP receiver on a loopback port that fails the first `failures`
// requests with 500.
struct Receiver {
  explicit Receiver(int failures) : failures_left(failures) {
    server.Post("/hook", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu);
      bodies.push_back(req.body);
      if (failures_left > 0) {
        --failures_left;
        res.status = 500;
        return;
      }
      res.status = 200;
    });
    port = server.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { server.listen_after_bind(); });
    // The port is bound already: connections queue until listen() runs.
    testutil::WaitUntil([&] { return server.is_running(); }, std::chrono::seconds(5), std::chrono::milliseconds(2));
  }
  ~Receiver() {
    server.stop();
    thread.join();
  }
  std::vector<std::string> Bodies() {
    std::lock_guard<std::mutex> lock(mu);
    return bodies;
  }
  httplib::Server server;
  std::mutex mu;
  std::vector<std::string> bodies;
  int failures_left;
  int port = 0;
  std::thread thread;
};

WebhookPolicy Quick() {
  WebhookPolicy p;
  p.first_backoff = 10 * kMillisecond;
  p.timeout = 2 * kSecond;
  return p;
}

TEST(WebhookSenderTest, DeliversInOrderAndRetriesAFailedDelivery) {
  Receiver r(1);
  auto s = WebhookSender::Create("http://127.0.0.1:" + std::to_string(r.port) + "/hook", Quick());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  (*s)->Post(R"({"n":1})");
  (*s)->Post(R"({"n":2})");
  ASSERT_TRUE((*s)->Flush(10 * kSecond));
  EXPECT_EQ((*s)->delivered(), 2);
  EXPECT_EQ((*s)->given_up(), 0);
  EXPECT_EQ(r.Bodies(), (std::vector<std::string>{R"({"n":1})", R"({"n":1})", R"({"n":2})"}));
}

TEST(WebhookSenderTest, AnUnreachableReceiverIsGivenUpWithoutBlockingThePoster) {
  int port;
  {
    Receiver gone(0);
    port = gone.port;
  }
  WebhookPolicy p = Quick();
  p.max_attempts = 3;
  auto s = WebhookSender::Create("http://127.0.0.1:" + std::to_string(port) + "/hook", p);
  ASSERT_TRUE(s.ok());
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) (*s)->Post("{}");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));  // Post only queues
  ASSERT_TRUE((*s)->Flush(20 * kSecond));
  EXPECT_EQ((*s)->given_up(), 5);
  EXPECT_EQ((*s)->delivered(), 0);
}

TEST(WebhookSenderTest, AFullQueueDropsItsOldest) {
  // The receiver holds the first delivery until all 50 are posted: the
  // queue of 2 must overflow, however fast the sender thread is (against a
  // refused port it could keep up, and the test was flaky).
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> received{0};
  httplib::Server server;
  server.Post("/hook", [&](const httplib::Request&, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
    ++received;
    res.status = 200;
  });
  int port = server.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { server.listen_after_bind(); });
  WebhookPolicy p = Quick();
  p.max_queue = 2;
  p.max_attempts = 1;
  auto s = WebhookSender::Create("http://127.0.0.1:" + std::to_string(port) + "/hook", p);
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 50; ++i) (*s)->Post("{}");
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  ASSERT_TRUE((*s)->Flush(20 * kSecond));
  server.stop();
  serving.join();
  EXPECT_GE((*s)->dropped(), 50 - 3);  // at most one in flight and two queued survive
  EXPECT_EQ((*s)->dropped() + (*s)->delivered() + (*s)->given_up(), 50);
  EXPECT_EQ((*s)->delivered(), received.load());
}

TEST(WebhookSenderTest, BadUrlsAreClearErrors) {
  EXPECT_NE(WebhookSender::Create("localhost:80/x").status().message().find("no scheme"), std::string::npos);
  EXPECT_NE(WebhookSender::Create("ftp://h/x").status().message().find("not http or https"), std::string::npos);
  EXPECT_NE(WebhookSender::Create("http:///x").status().message().find("no host"), std::string::npos);
}

TEST(AlertPublisherTest, AlertsOnIncidentsDecisionsEvictionsStragglersAndTheEnd) {
  EXPECT_EQ(AlertPublisher::AlertKind("failure"), "incident");
  EXPECT_EQ(AlertPublisher::AlertKind("decision"), "decision");
  EXPECT_EQ(AlertPublisher::AlertKind("node_evicted"), "eviction");
  EXPECT_EQ(AlertPublisher::AlertKind("job_failed"), "job_end");
  EXPECT_EQ(AlertPublisher::AlertKind("heartbeat"), "");
  Event e;
  e.job_id = "j";
  e.kind = "node_evicted";
  e.node = "node3";
  e.wall_ns = 5 * kSecond;
  e.message = "node node3 leaves the job";
  e.detail_json = R"({"reason":"xid"})";
  auto j = nlohmann::json::parse(AlertPublisher::AlertJson(e, "eviction"));
  EXPECT_EQ(j["alert"], "eviction");
  EXPECT_EQ(j["node"], "node3");
  EXPECT_EQ(j["time_unix_ms"], 5000);
  EXPECT_EQ(j["detail"]["reason"], "xid");
  EXPECT_EQ(j["text"], "[trainguard] job j: node node3 leaves the job");
}

}  // namespace
}  // namespace trainguard
