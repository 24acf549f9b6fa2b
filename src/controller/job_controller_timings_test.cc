// JobController: step timings on the controller's clock, stragglers
// reported and, with --straggler-action evict, evicted at every job size.
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "controller/job_controller_test_fixture.h"

namespace trainguard {
namespace {

TEST_F(JobControllerTest, StepTimingsAreStoredOnTheControllersClock) {
  Make(2, 1);
  FakeAgentLink* a = Register(0);
  FakeAgentLink* b = Register(1);
  controller_->Tick();
  ASSERT_NE(a->Last(Kind::kClockProbe), nullptr);
  std::int64_t t0 = a->Last(Kind::kClockProbe)->clock_probe().controller_unix_us();
  EXPECT_EQ(b->Last(Kind::kClockProbe)->clock_probe().controller_unix_us(), t0);
  clock_.Advance(2 * kMillisecond);
  v1::AgentMessage echo;
  echo.mutable_clock_echo()->set_controller_unix_us(t0);
  echo.mutable_clock_echo()->set_agent_unix_us(t0 + 1000 + 5'000'000);  // node0: 5 s ahead
  controller_->OnMessage(1, echo);
  echo.mutable_clock_echo()->set_agent_unix_us(t0 + 1000 + 300);        // node1: 0.3 ms, within 1 ms
  controller_->OnMessage(2, echo);
  Timings(0, 0, 1, 0, 3, 1.0, -1, 10'000'000);
  Timings(1, 0, 1, 0, 3, 1.0, -1, 10'000'000);
  auto rows = Stored().StepTimings("job", 0, 100).value();
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].rank, 0);
  EXPECT_EQ(rows[0].node, "node0");
  EXPECT_EQ(rows[0].start_us, 10'000'000 - 5'000'000);
  EXPECT_EQ(rows[0].clock_error_us, 1000);
  EXPECT_EQ(rows[1].start_us, 10'000'000);
  EXPECT_EQ(rows[0].totals, "forward=30000;backward=60000;comm:all_reduce=500");
  EXPECT_EQ(rows[0].intervals.substr(0, 18), "forward,1,0,30000;");
}

// A link whose Send waits until the test opens it: the controller holds
// its lock all the while.
class GatedLink final : public AgentLink {
 public:
  void Send(const v1::ControllerMessage&) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void Close() override {}
  Nanos LastHeardMono() const override { return 0; }
  void Shut() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return entered_ >= n; });
  }
  int entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int entered_ = 0;
};

// Step timings and clock echoes need no job lock (telemetry_ingest.h): while
// the controller is held up inside a send, under its lock, another node's
// timings are still stored and its clock still measured.
TEST_F(JobControllerTest, StepTimingsAreTakenInWhileTheJobsLockIsHeld) {
  Make(2, 1);
  auto gated = std::make_shared<GatedLink>();
  controller_->OnConnect(1, gated);
  v1::AgentMessage reg;
  reg.mutable_register_()->set_protocol_version(kProtocolVersion);
  reg.mutable_register_()->set_node_id("node0");
  reg.mutable_register_()->set_address("10.0.0.0");
  reg.mutable_register_()->set_free_port(40000);
  controller_->OnMessage(1, reg);
  Register(1);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  Timings(1, 0, 1, 0, 2);  // a step's worth of rows (2 ranks): a try at its layout, under the lock
  gated->Shut();
  const int sent = gated->entered();
  std::thread ticker([&] { controller_->Tick(); });  // probes the clocks: stuck in node0's send
  ASSERT_TRUE(gated->WaitEntered(sent + 1));
  auto timings = std::async(std::launch::async, [&] {
    Timings(1, 0, 1, 2, 3);
    v1::AgentMessage echo;
    echo.mutable_clock_echo()->set_controller_unix_us(clock_.WallNanos() / 1000);
    echo.mutable_clock_echo()->set_agent_unix_us(clock_.WallNanos() / 1000 + 2'000'000);
    controller_->OnMessage(2, echo);
  });
  const bool taken = timings.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  gated->Open();
  ticker.join();
  timings.wait();
  EXPECT_TRUE(taken) << "the timings waited for the job's lock";
  auto rows = Stored().StepTimings("job", 0, 100).value();
  EXPECT_EQ(rows.size(), 3u);
  // The echo counted: node1's next steps are put on the controller's clock.
  Timings(1, 0, 1, 3, 4, 1.0, -1, 10'000'000);
  rows = Stored().StepTimings("job", 3, 4).value();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_NEAR(static_cast<double>(rows[0].start_us), 10'000'000 + 3 * 100000 - 2'000'000, 1000);
}

TEST_F(JobControllerTest, AStragglerIsReportedAndWithEvictTakenOutOfTheJob) {
  config_.straggler_action = StragglerAction::kEvict;
  Make(4, 2, 3, true);
  std::vector<FakeAgentLink*> links;
  for (int i = 0; i < 4; ++i) links.push_back(Register(i));
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < (p.windows_to_evict + 2) * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 2, step, step + 10, 1.2, 2);
    if (controller_->state() != JobState::kRunning) break;
  }
  auto found = EventsOf("straggler");
  ASSERT_EQ(found.size(), 2u);  // reported, then evictable
  EXPECT_EQ(found[0].node, "node2");
  EXPECT_EQ(Detail("straggler")["signal"], "compute");
  EXPECT_FALSE(Detail("straggler", 0)["evict"].get<bool>());
  EXPECT_TRUE(Detail("straggler", 1)["evict"].get<bool>());
  EXPECT_EQ(controller_->state(), JobState::kStopping);
  for (int node = 0; node < 4; ++node) Stopped(node, 0);
  EXPECT_EQ(Detail("attribution")["rule"], "straggler-compute");
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node2"});
  EXPECT_EQ(Stored().GetNodeHealth("node2")->status, "cordoned");
}

// The eviction is the detector's typed verdict, whatever the job's size (with
// fewer than 3 nodes the detector judges ranks) and whatever a site's rule
// file says of the lines: a rule that claims the straggler's own id, and one
// that matches every line with the highest priority, change nothing.
class StragglerEvictionTest : public JobControllerTest, public testing::WithParamInterface<int> {};

TEST_P(StragglerEvictionTest, TheSlowNodeIsEvictedAndNoRuleFileChangesThat) {
  const int nnodes = GetParam();
  config_.straggler_action = StragglerAction::kEvict;
  config_.spares = 1;
  rules_override_ = R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
    {"id": "straggler-compute", "category": "user_code", "priority": 100, "role": "cause", "persistence": "persistent",
     "hardware": false, "action": "stop", "pattern": "straggler", "description": "hostile"},
    {"id": "catch-all", "category": "user_code", "priority": 100, "role": "cause", "persistence": "persistent",
     "hardware": false, "action": "stop", "pattern": ".", "description": "hostile"}]})";
  const int nproc = nnodes == 1 ? 4 : 2;  // the detector needs 3 units to compare
  Make(nnodes, nproc, 3, true);
  for (int i = 0; i < nnodes; ++i) Register(i);
  Register(nnodes);  // the spare
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  const int slow_node = nnodes - 1;
  slow_rank_ = slow_node * nproc + 1;  // one rank of the last node computes 60 % slower
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < (p.windows_to_evict + 2) * p.window_steps; step += 10) {
    for (int node = 0; node < nnodes; ++node) Timings(node, 0, nproc, step, step + 10, 1.6, -1);
    if (controller_->state() != JobState::kRunning) break;
  }
  ASSERT_EQ(controller_->state(), JobState::kStopping) << nnodes << " node(s)";
  for (int node = 0; node < nnodes; ++node) Stopped(node, 0);
  const std::string slow = "node" + std::to_string(slow_node);
  EXPECT_EQ(Detail("failure")["failure_kind"], "straggler");
  EXPECT_EQ(Detail("attribution")["rule"], "straggler-compute");
  EXPECT_EQ(Detail("attribution")["category"], "other");
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{slow});
  EXPECT_EQ(Stored().GetNodeHealth(slow)->status, "cordoned");
  EXPECT_EQ(EventsOf("spare_promoted").size(), 1u);
  EXPECT_EQ(controller_->state(), JobState::kRunning);  // restarted with the spare
}

// A node whose rank waits for its data is a data straggler, and evicted as
// one: its cause is its data loader or its storage, never its links.
TEST_F(JobControllerTest, ADataStragglerIsEvictedForItsDataNeverAsANetworkFault) {
  config_.straggler_action = StragglerAction::kEvict;
  Make(4, 2, 3, true);
  for (int i = 0; i < 4; ++i) Register(i);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  data_rank_ = 5;  // node2's second rank waits 25 ms a step for its batch
  data_wait_us_ = 25000;
  const StragglerPolicy p;
  for (std::int64_t step = 0; step < (p.windows_to_evict + 2) * p.window_steps; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 2, step, step + 10);
    if (controller_->state() != JobState::kRunning) break;
  }
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  EXPECT_EQ(Detail("straggler")["signal"], "data");
  EXPECT_EQ(EventsOf("straggler")[0].node, "node2");
  for (int node = 0; node < 4; ++node) Stopped(node, 0);
  const auto a = Detail("attribution");
  EXPECT_EQ(a["rule"], "straggler-data");
  // The failure's kind by name in every record of it (it was a number in two).
  EXPECT_EQ(Detail("failure")["failure_kind"], "straggler");
  EXPECT_EQ(a["failure_kind"], "straggler");
  const auto incidents = Stored().IncidentsOnNode("node2").value();
  ASSERT_EQ(incidents.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(incidents[0].detail_json)["failure_kind"], "straggler");
  EXPECT_EQ(incidents[0].category, "storage");
  EXPECT_EQ(a["category"], "storage");
  EXPECT_EQ(a["hardware"], false);
  EXPECT_EQ(a["description"].get<std::string>().find("links"), std::string::npos) << a["description"];
  EXPECT_NE(a["description"].get<std::string>().find("data loader"), std::string::npos) << a["description"];
  EXPECT_EQ(Detail("decision")["decision"], "evict_node");
  EXPECT_EQ(provider_.evicted, std::vector<std::string>{"node2"});
  EXPECT_EQ(Stored().GetNodeHealth("node2")->status, "cordoned");
  const auto actions = Stored().NodeActions("node2").value();  // the node's history, as `trainguard nodes` shows it
  ASSERT_FALSE(actions.empty());
  EXPECT_EQ(actions.back().evidence_json.find("network"), std::string::npos) << actions.back().evidence_json;
  EXPECT_NE(actions.back().evidence_json.find("storage"), std::string::npos) << actions.back().evidence_json;
}

INSTANTIATE_TEST_SUITE_P(Sizes, StragglerEvictionTest, testing::Values(1, 2, 3, 8));

TEST_F(JobControllerTest, AStragglerIsOnlyReportedByDefault) {
  Make(4, 1);
  for (int i = 0; i < 4; ++i) Register(i);
  for (std::int64_t step = 0; step < 200; step += 10) {
    for (int node = 0; node < 4; ++node) Timings(node, 0, 1, step, step + 10, 1.3, 1);
  }
  EXPECT_EQ(EventsOf("straggler").size(), 2u);
  EXPECT_EQ(EventsOf("straggler")[0].node, "node1");
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_TRUE(provider_.evicted.empty());
  // Timings of another generation are stored but judge nobody.
  Timings(3, 7, 1, 500, 600, 5.0, 3);
  EXPECT_EQ(EventsOf("straggler").size(), 2u);
  EXPECT_EQ(Stored().StepTimings("job", 500, 600)->size(), 100u);
}

}  // namespace
}  // namespace trainguard
