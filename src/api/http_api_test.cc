#include "api/http_api.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "api/prometheus_text.h"
#include "controller/fake_agent_link.h"
#include "testing/wait_until.h"

namespace trainguard {
namespace {

using nlohmann::json;

// A real controller (fake clock, in-memory store, fake agent links) behind a
// real HTTP server on loopback, asked by a real HTTP client.
class HttpApiTest : public testing::Test {
 protected:
  void SetUp() override {
    config_.job_id = "job";
    config_.nnodes = 2;
    config_.nproc_per_node = 1;
    config_.argv = {"python3", "train.py"};
    config_.max_restarts = 2;
    config_.heartbeat_interval = 1 * kSecond;
    config_.missed_heartbeats = 3;
    config_.hang_timeout = 60 * kSecond;
    auto rules = RuleSet::Load(TG_RULES_FILE);
    ASSERT_TRUE(rules.ok()) << rules.status().ToString();
    rules_ = std::make_unique<RuleSet>(std::move(rules.value()));
    controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_, rules_.get());
    controller_->SetOffLockThreads(0);
    ASSERT_TRUE(controller_->Start().ok());
    HttpApiOptions o;
    o.token = "s3cret-token";
    o.stream_poll = 20 * kMillisecond;
    api_ = std::make_unique<HttpApi>(&store_, o);
    ASSERT_TRUE(api_->Start(controller_.get()).ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", api_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override { api_->Stop(); }

  void Register(int i) {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(i + 1, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(kProtocolVersion);
    m.mutable_register_()->set_node_id("node" + std::to_string(i));
    m.mutable_register_()->set_address("10.0.0." + std::to_string(i));
    m.mutable_register_()->set_free_port(40000 + i);
    controller_->OnMessage(i + 1, m);
  }
  void Heartbeat(int node, std::int64_t step, std::int64_t first_ms, std::int64_t last_ms) {
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(0);
    v1::RankStatus* r = m.mutable_heartbeat()->add_ranks();
    r->set_global_rank(node);
    r->set_running(true);
    r->set_attached(true);
    r->set_pid(1000 + node);
    r->set_step(step);
    r->set_step_count(step + 1);
    r->set_first_step_unix_ms(first_ms);
    r->set_first_step(0);
    r->set_last_step_unix_ms(last_ms);
    r->set_phase("forward");
    r->set_checkpoint_step(-1);
    controller_->OnMessage(node + 1, m);
  }
  json Get(const std::string& path, int want_status = 200) {
    auto res = client_->Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return json();
    EXPECT_EQ(res->status, want_status) << path << ": " << res->body;
    return json::parse(res->body, nullptr, false);
  }

  JobConfig config_;
  FakeClock clock_;
  InMemoryEventStore store_;
  FakeNodeProvider provider_;
  std::unique_ptr<RuleSet> rules_;
  std::unique_ptr<JobController> controller_;
  std::unique_ptr<HttpApi> api_;
  std::unique_ptr<httplib::Client> client_;
  std::vector<std::shared_ptr<FakeAgentLink>> links_;
};

TEST_F(HttpApiTest, ServesTheJobItsNodesAndRanksAsTheControllerHoldsThem) {
  Register(0);
  Register(1);
  const std::int64_t now_ms = clock_.WallNanos() / kMillisecond;
  Heartbeat(0, 10, now_ms - 5000, now_ms);  // 10 steps in 5 s
  Heartbeat(1, 10, now_ms - 4000, now_ms);
  clock_.Advance(1500 * kMillisecond);
  json job = Get("/api/v1/job");
  EXPECT_EQ(job["job_id"], "job");
  EXPECT_EQ(job["state"], "RUNNING");
  EXPECT_EQ(job["step"], 10);
  EXPECT_EQ(job["world_size"], 2);
  EXPECT_DOUBLE_EQ(job["steps_per_second"].get<double>(), 2.0);  // the slower rank's
  EXPECT_EQ(job["command"], "python3 train.py");

  json nodes = Get("/api/v1/nodes")["nodes"];
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[1]["node_id"], "node1");
  EXPECT_EQ(nodes[1]["role"], "member");
  EXPECT_EQ(nodes[1]["group_rank"], 1);
  EXPECT_NEAR(nodes[1]["heartbeat_age_s"].get<double>(), 1.5, 1e-6);
  EXPECT_EQ(nodes[1]["health"]["status"], "ok");
  EXPECT_TRUE(nodes[1]["diagnostics"].is_null());

  json ranks = Get("/api/v1/ranks")["ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0]["pid"], 1000);
  EXPECT_EQ(ranks[0]["phase"], "forward");

  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), kPrometheusContentType);
  EXPECT_NE(metrics->body.find("trainguard_job_state{job_id=\"job\",state=\"RUNNING\"} 1\n"), std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("trainguard_node_heartbeat_age_seconds{job_id=\"job\",node=\"node1\"} 1.5\n"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("trainguard_job_steps_per_second{job_id=\"job\"} 2\n"), std::string::npos);
}

TEST_F(HttpApiTest, AnIncidentShowsWithItsAttributionAndTheEventsPageAndStream) {
  Register(0);
  Register(1);
  // The live stream, read while the incident happens.
  std::string streamed;
  std::thread reader([&] {
    httplib::Client c("127.0.0.1", api_->port());
    c.set_read_timeout(20, 0);
    c.Get("/api/v1/events/stream", [&](const char* data, size_t n) {
      streamed.append(data, n);
      return streamed.find("event: decision") == std::string::npos;  // enough: hang up
    });
  });
  v1::AgentMessage m;
  auto* e = m.mutable_rank_exited();
  e->set_generation(0);
  e->mutable_rank()->set_global_rank(1);
  e->mutable_rank()->set_exit_code(1);
  e->mutable_rank()->set_step(-1);
  e->add_log_tail("RuntimeError: CUDA error: an illegal memory access was encountered");
  e->set_exit_unix_ms(clock_.WallNanos() / kMillisecond);
  controller_->OnMessage(2, m);
  for (int i : {0, 1}) {
    v1::AgentMessage s;
    s.mutable_stopped()->set_generation(0);
    s.mutable_stopped()->set_free_port(50000 + i);
    controller_->OnMessage(i + 1, s);
  }
  reader.join();
  ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(10)));  // what the pages read is in the store
  EXPECT_NE(streamed.find("event: failure\n"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("event: attribution\n"), std::string::npos);

  json incidents = Get("/api/v1/incidents")["incidents"];
  ASSERT_EQ(incidents.size(), 1u);
  EXPECT_FALSE(incidents[0].value("category", "").empty()) << incidents.dump();
  EXPECT_EQ(incidents[0]["culprit_ranks"], json::array({1}));
  EXPECT_FALSE(incidents[0]["decision"].get<std::string>().empty());

  json downtime = Get("/api/v1/downtime");
  EXPECT_EQ(downtime["restarts"], 1);
  EXPECT_EQ(downtime["incidents"].size(), 1u);

  // Pages of events: after an id, with a limit; next_after continues.
  json first = Get("/api/v1/events?limit=2");
  ASSERT_EQ(first["events"].size(), 2u);
  EXPECT_EQ(first["events"][0]["kind"], "job_created");
  json rest = Get("/api/v1/events?after=" + std::to_string(first["next_after"].get<std::int64_t>()));
  auto all = store_.Events("job");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(first["events"].size() + rest["events"].size(), all->size());
  EXPECT_EQ(rest["events"][0]["id"], (*all)[2].id);

  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("trainguard_job_restarts_total{job_id=\"job\"} 1\n"), std::string::npos)
      << metrics->body;
  std::string category = incidents[0]["category"];
  EXPECT_NE(metrics->body.find("trainguard_job_incidents_total{job_id=\"job\",category=\"" + category + "\"} 1\n"),
            std::string::npos);
}

TEST_F(HttpApiTest, AStreamGetsEveryEventRecordedBeforeTheApiStopsThenItsEnd) {
  std::string streamed;
  std::atomic<bool> open{false};
  std::thread reader([&] {
    httplib::Client c("127.0.0.1", api_->port());
    c.set_read_timeout(20, 0);
    c.Get("/api/v1/events/stream?plain=1", [&](const char* data, size_t n) {
      streamed.append(data, n);
      open = true;
      return true;
    });
  });
  ASSERT_TRUE(testutil::WaitUntil([&] { return open.load(); }, std::chrono::seconds(20)));  // job_created arrived
  for (int i = 0; i < 50; ++i) {
    Event e;
    e.job_id = "job";
    e.kind = "late";
    e.message = "event " + std::to_string(i);
    ASSERT_TRUE(store_.Append(e).ok());
  }
  api_->Stop();  // right after the last append
  reader.join();
  EXPECT_NE(streamed.find("\"message\":\"event 49\""), std::string::npos) << streamed.substr(streamed.size() - 300);
  EXPECT_EQ(streamed.find("event: late"), std::string::npos);  // plain: no types but the end's
  EXPECT_NE(streamed.rfind("event: end\n"), std::string::npos);
}

TEST_F(HttpApiTest, ActionsNeedTheTokenAndCordonAndCancelWork) {
  Register(0);
  Register(1);
  auto post = [&](const std::string& path, const std::string& token, const std::string& body) {
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
    return client_->Post(path.c_str(), h, body, "application/json");
  };
  auto no_token = post("/api/v1/cancel", "", "{}");
  ASSERT_TRUE(no_token);
  EXPECT_EQ(no_token->status, 401);
  EXPECT_NE(no_token->body.find("needs the job's secret"), std::string::npos);
  auto wrong = post("/api/v1/cancel", "s3cret-tokem", "{}");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 403);
  EXPECT_FALSE(controller_->finished());

  auto no_reason = post("/api/v1/nodes/node1/cordon", "s3cret-token", "{}");
  ASSERT_TRUE(no_reason);
  EXPECT_EQ(no_reason->status, 400);
  auto cordon = post("/api/v1/nodes/node1/cordon", "s3cret-token", R"({"reason":"ECC errors"})");
  ASSERT_TRUE(cordon);
  EXPECT_EQ(cordon->status, 200) << cordon->body;
  auto health = store_.GetNodeHealth("node1");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, "cordoned");
  EXPECT_EQ(health->reason, "ECC errors");
  auto actions = store_.NodeActions("node1");
  ASSERT_TRUE(actions.ok());
  ASSERT_EQ(actions->size(), 1u);
  EXPECT_EQ((*actions)[0].by, "API client 127.0.0.1");
  EXPECT_EQ(Get("/api/v1/nodes")["nodes"][1]["health"]["status"], "cordoned");
  auto uncordon = post("/api/v1/nodes/node1/uncordon", "s3cret-token", "{}");
  ASSERT_TRUE(uncordon);
  EXPECT_EQ(uncordon->status, 200);
  EXPECT_EQ(store_.GetNodeHealth("node1")->status, "ok");
  auto unknown = post("/api/v1/nodes/node7/uncordon", "s3cret-token", "{}");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);

  auto cancel = post("/api/v1/cancel", "s3cret-token", R"({"reason":"done for today"})");
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 200);
  EXPECT_EQ(controller_->state(), JobState::kFailed);
  EXPECT_NE(controller_->summary().find("cancelled through the API from 127.0.0.1: done for today"),
            std::string::npos)
      << controller_->summary();
  auto again = post("/api/v1/cancel", "s3cret-token", "{}");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409);
}

TEST_F(HttpApiTest, ServesTheDashboardWithItsTypes) {
  auto page = client_->Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script src=\"/dashboard.js\">"), std::string::npos);
  for (const auto& [path, type] : std::vector<std::pair<std::string, std::string>>{
           {"/dashboard.js", "text/javascript; charset=utf-8"}, {"/dashboard.css", "text/css; charset=utf-8"}}) {
    auto asset = client_->Get(path.c_str());
    ASSERT_TRUE(asset) << path;
    EXPECT_EQ(asset->status, 200) << path;
    EXPECT_EQ(asset->get_header_value("Content-Type"), type) << path;
    EXPECT_GT(asset->body.size(), 1000u) << path;
  }
}

TEST_F(HttpApiTest, BadQueriesAreClearErrors) {
  EXPECT_EQ(Get("/api/v1/events?after=abc", 400)["error"], "query parameter after='abc' is not an integer");
  EXPECT_EQ(Get("/api/v1/events?limit=0", 400)["error"], "limit must be 1..10000");
  EXPECT_NE(Get("/api/v1/timings?steps=x", 400)["error"].get<std::string>().find("'x' is not A:B"), std::string::npos);
  EXPECT_NE(Get("/api/v1/timings?steps=0:5000", 400)["error"].get<std::string>().find("at most 1000"),
            std::string::npos);
  EXPECT_EQ(Get("/api/v1/hang", 404)["error"], "job job had no hang");
  EXPECT_EQ(Get("/api/v1/heatmap?format=png", 400)["error"], "format must be svg or html");
  EXPECT_EQ(Get("/api/v1/timings?steps=0:9")["timings"].size(), 0u);
}

TEST(HttpApiStartTest, ABadOrTakenAddressIsRefusedNamingIt) {
  JobConfig config;
  config.job_id = "j";
  FakeClock clock;
  InMemoryEventStore store;
  JobController controller(config, &clock, &store, nullptr);
  HttpApi bad(&store, {"localhost", "", 8, 250 * kMillisecond});
  Status s = bad.Start(&controller);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'localhost' is not HOST:PORT"), std::string::npos);
  HttpApi first(&store, {"127.0.0.1:0", "", 8, 250 * kMillisecond});
  ASSERT_TRUE(first.Start(&controller).ok());
  HttpApi second(&store, {"127.0.0.1:" + std::to_string(first.port()), "", 8, 250 * kMillisecond});
  s = second.Bind();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("127.0.0.1:" + std::to_string(first.port())), std::string::npos);
}

TEST(HttpApiStartTest, AStopRightAfterTheStartEnds) {
  JobConfig config;
  config.job_id = "j";
  FakeClock clock;
  InMemoryEventStore store;
  JobController controller(config, &clock, &store, nullptr);
  for (int i = 0; i < 100; ++i) {
    HttpApi api(&store, {"127.0.0.1:0", "", 8, 250 * kMillisecond});
    ASSERT_TRUE(api.Start(&controller).ok());
  }  // each one stops in its destructor: a hang here is the bug
}

}  // namespace
}  // namespace trainguard
