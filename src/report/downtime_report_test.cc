#include "report/downtime_report.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

// Wall times are seconds after T0 (a wall time of 0 means "none").
constexpr double kT0 = 1.7e9;
Nanos Wall(double s) { return static_cast<Nanos>((kT0 + s) * kSecond); }

Event At(double s, const std::string& kind, std::int64_t generation, const std::string& detail = "{}") {
  Event e;
  e.job_id = "j";
  e.wall_ns = Wall(s);
  e.kind = kind;
  e.generation = generation;
  e.detail_json = detail;
  return e;
}

std::string Ms(const char* key, double s) {
  return "\"" + std::string(key) + "\":" + std::to_string(static_cast<long long>((kT0 + s) * 1000));
}

// Created at 0, generation 0 steps 0..99 from 2 s to 12 s with a checkpoint
// at step 50; a fault at 12 s, detected at 13 s, stopped at 14 s;
// generation 1 steps again from 16 s.
std::vector<Event> OneIncident() {
  return {At(0, "job_created", -1),
          At(2, "first_step", 0, "{" + Ms("first_step_unix_ms", 2) + ",\"first_step\":0}"),
          At(13, "failure", 0,
             "{" + Ms("fault_unix_ms", 12) + "," + Ms("detected_unix_ms", 13) + "," +
                 Ms("last_step_unix_ms", 12) +
                 ",\"failure_step\":100,\"checkpoint_step\":50,\"incident\":1,\"failure_kind\":\"rank_crash\"}"),
          At(13.1, "attribution", 0, R"({"category":"hardware","culprit_nodes":["node1"]})"),
          At(13.2, "decision", 0, R"({"decision":"restart","reason":"transient"})"),
          At(14, "stopped", 0),
          At(16, "first_step", 1, "{" + Ms("first_step_unix_ms", 16) + ",\"first_step\":51}")};
}

TEST(DowntimeReportTest, AJobThatHasNotEndedNeedsTheLiveState) {
  auto events = OneIncident();
  auto ended_only = ComputeReport("j", events);
  EXPECT_EQ(ended_only.status().code(), StatusCode::kFailedPrecondition);

  LiveJob live{Wall(30), "RUNNING", 1, Wall(29), 400};
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state, "RUNNING");
  EXPECT_EQ(r->restarts, 1);
  EXPECT_DOUBLE_EQ(r->wall_s, 30);
  EXPECT_DOUBLE_EQ(r->startup_s, 2);
  EXPECT_DOUBLE_EQ(r->detection_s, 1);
  EXPECT_DOUBLE_EQ(r->shutdown_s, 1);
  EXPECT_DOUBLE_EQ(r->restart_s, 2);
  EXPECT_NEAR(r->lost_s, 5, 1e-9);    // steps 50..100 of an even 10 s
  EXPECT_NEAR(r->tail_s, 1, 1e-9);    // the newest step was 1 s ago
  EXPECT_NEAR(r->checkpoint_s, 0.4, 1e-9);
  EXPECT_EQ(r->lost_steps, 50);
  // The terms add up to the wall time.
  double sum = r->productive_s + r->startup_s + r->lost_s + r->detection_s + r->shutdown_s + r->restart_s +
               r->tail_s + r->checkpoint_s;
  EXPECT_NEAR(sum, r->wall_s, 1e-6);
  ASSERT_EQ(r->incidents.size(), 1u);
  EXPECT_EQ(r->incidents[0]["category"], "hardware");
  EXPECT_EQ(r->incidents[0]["decision"], "restart");
}

// The controller saw generation 1's first step, and its event is still on
// its way to the store: the live state closes the restart there, as the
// stored event will, rather than let it run on to now.
TEST(DowntimeReportTest, AFirstStepNotStoredYetClosesTheRestartFromTheLiveState) {
  auto events = OneIncident();
  events.pop_back();  // generation 1's first_step, not written yet
  LiveJob live{Wall(30), "RUNNING", 1, Wall(29), 400};
  auto open = ComputeReport("j", events, &live);
  ASSERT_TRUE(open.ok());
  EXPECT_DOUBLE_EQ(open->restart_s, 16);  // none known: restarting until now
  EXPECT_TRUE(open->incidents[0]["restart_open"]);
  live.generation = 1;
  live.first_step_wall = Wall(16);
  live.first_step_no = 51;
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok());
  auto stored = ComputeReport("j", OneIncident(), &live);
  ASSERT_TRUE(stored.ok());
  EXPECT_DOUBLE_EQ(r->restart_s, 2);
  EXPECT_FALSE(r->incidents[0]["restart_open"]);
  EXPECT_DOUBLE_EQ(r->restart_s, stored->restart_s);
  EXPECT_DOUBLE_EQ(r->productive_s, stored->productive_s);
  EXPECT_DOUBLE_EQ(r->tail_s, stored->tail_s);
}

// A save that commits between the failure and the stop is what the restart
// resumes from: the report counts lost work from it, as the downtime event
// does, not from the checkpoint the failure event knew of.
TEST(DowntimeReportTest, LostWorkCountsFromTheCheckpointTheRestartResumedFrom) {
  auto events = OneIncident();
  events.push_back(At(16.1, "downtime", 1, R"({"incident":1,"resumed_step":80,"lost_steps":20})"));
  LiveJob live{Wall(30), "RUNNING", 1, Wall(29), 0};
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->lost_steps, 20);
  EXPECT_NEAR(r->lost_s, 2, 1e-9);  // steps 80..100 of an even 10 s
  ASSERT_EQ(r->incidents.size(), 1u);
  EXPECT_EQ(r->incidents[0]["checkpoint_step"], 80);
  EXPECT_EQ(r->incidents[0]["lost_steps"], 20);
  // No checkpoint resumed from (null): the failure's own stands.
  events.back() = At(16.1, "downtime", 1, R"({"incident":1,"resumed_step":null})");
  EXPECT_EQ(ComputeReport("j", events, &live)->lost_steps, 50);
}

TEST(DowntimeReportTest, TheRecordedEndWinsOverTheLiveState) {
  auto events = OneIncident();
  events.push_back(At(40, "job_succeeded", 1,
                      "{\"restart_count\":1," + Ms("last_step_unix_ms", 39) + ",\"checkpoint_overhead_ms\":0}"));
  LiveJob live{Wall(50), "RUNNING", 7, Wall(49), 0};
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state, "SUCCEEDED");
  EXPECT_EQ(r->restarts, 1);
  EXPECT_DOUBLE_EQ(r->wall_s, 40);
  EXPECT_NEAR(r->tail_s, 1, 1e-9);
}

TEST(DowntimeReportTest, AStepNewerThanNowIsClampedSoNoTermIsNegative) {
  auto events = OneIncident();
  LiveJob live{Wall(20), "RUNNING", 1, Wall(21), 0};  // the node's clock ran ahead
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->tail_s, 0);
  EXPECT_NEAR(r->wall_s, 20, 1e-9);
}

TEST(DowntimeReportTest, StorageIsNamedWhenTheLoaderOrThePreviousSavesWriteHeldTheJob) {
  // Generation 0 waited 6 s for data (of 10 s of steps, half of them kept)
  // and its saves 0.3 s of 0.4 s for the previous save's write; the live
  // generation 1 waited 3 s for data.
  auto events = OneIncident();
  events[2].detail_json.insert(events[2].detail_json.size() - 1,
                               ",\"checkpoint_overhead_ms\":400,\"checkpoint_wait_ms\":300,\"data_wait_ms\":6000");
  LiveJob live{Wall(30), "RUNNING", 1, Wall(29), 0, 0, 3000};
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NEAR(r->checkpoint_s, 0.2, 1e-9);       // the kept half of 0.4 s
  EXPECT_NEAR(r->checkpoint_wait_s, 0.15, 1e-9);  // the kept half of 0.3 s
  EXPECT_NEAR(r->data_wait_s, 3 + 3, 1e-9);      // the kept half of 6 s, and the live generation's 3 s
  const std::string line = StorageLine(*r);
  EXPECT_NE(line.find("storage: the data loader held the job 6.00 s ("), std::string::npos) << line;
  EXPECT_NE(line.find("checkpoint saves waited 0.15 s (75 % of the checkpoint overhead) for the previous "
                      "save's write to storage"),
            std::string::npos)
      << line;
  EXPECT_NE(ReportText(*r).find(line), std::string::npos);
  nlohmann::json j = ReportJson(*r);
  EXPECT_TRUE(j["storage"]["named"].get<bool>());
  EXPECT_NEAR(j["storage"]["data_wait_s"].get<double>(), 6, 1e-9);
  // Small waits name nothing.
  DowntimeReport quiet = *r;
  quiet.data_wait_s = 0.01;
  quiet.checkpoint_wait_s = 0.001;
  EXPECT_EQ(StorageLine(quiet), "");
  EXPECT_FALSE(ReportJson(quiet)["storage"]["named"].get<bool>());
}

TEST(DowntimeReportTest, TheCheckpointIntervalsCostIsSetAgainstTheOptimum) {
  // An hour: 3000 s kept, 10 s blocked in 10 saves, 500 s lost at 4 failures.
  DowntimeReport r;
  r.has_progress = true;
  r.wall_s = 3600;
  r.productive_s = 3000;
  r.checkpoint_s = 10;
  r.lost_s = 500;
  nlohmann::json plan = {{"memory_interval_s", 60.0}, {"job_mtbf_s", 5000.0}, {"save_cost_s", 2.0}};
  CheckpointCost c = ComputeCheckpointCost(r, 10, 4, plan);
  EXPECT_NEAR(c.interval_s, 351, 1e-9);  // kept and lost step time per save
  EXPECT_NEAR(c.save_share, 10.0 / 3600, 1e-12);
  EXPECT_NEAR(c.lost_share, 500.0 / 3600, 1e-12);
  EXPECT_NEAR(c.save_cost_s, 1, 1e-12);  // measured, not the plan's 2 s
  EXPECT_NEAR(c.mtbf_s, 900, 1e-9);      // the job's own failures, not the plan's 5000 s
  EXPECT_EQ(c.mtbf_from, "incidents");
  EXPECT_NEAR(c.optimum_s, 41.76, 0.01);  // Daly for 1 s and 900 s
  EXPECT_NEAR(c.optimum_share, 1 / 42.76 + 42.76 / 2 / 900, 1e-3);
  EXPECT_DOUBLE_EQ(c.plan_interval_s, 60);
  const std::string line = CheckpointCostLine(c);
  EXPECT_NE(line.find("checkpoints: 10 save(s), one every 5.8 min of training: they cost 14.2 % of this job "
                      "(saves 0.3 %, work lost at failures 13.9 %); every 41.8 s would have cost about 4.7 % "
                      "(Young/Daly for a save blocking 1.000 s and a failure every 15.0 min, as this job saw "
                      "them); its checkpoint plan says every 60.0 s"),
            std::string::npos)
      << line;
  // No failure: the plan's MTBF; no save: nothing to say.
  CheckpointCost calm = ComputeCheckpointCost(r, 10, 0, plan);
  EXPECT_EQ(calm.mtbf_from, "plan");
  EXPECT_DOUBLE_EQ(calm.mtbf_s, 5000);
  EXPECT_EQ(CheckpointCostLine(ComputeCheckpointCost(r, 0, 4, nlohmann::json())), "");
}

TEST(DowntimeReportTest, TheReportCountsTheCommitsAndTakesTheNewestPlan) {
  auto events = OneIncident();
  events.insert(events.begin() + 2, At(5, "checkpoint_committed", 0));
  events.insert(events.begin() + 2, At(4, "checkpoint_plan", 0, R"({"memory_interval_s":30,"job_mtbf_s":100})"));
  events.push_back(At(17, "checkpoint_plan", 1, R"({"memory_interval_s":20,"job_mtbf_s":90})"));
  events.push_back(At(18, "checkpoint_committed", 1));
  events.push_back(At(40, "job_succeeded", 1,
                      "{\"restart_count\":1," + Ms("last_step_unix_ms", 39) + ",\"checkpoint_overhead_ms\":200}"));
  auto r = ComputeReport("j", events);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->checkpoints.saves, 2);
  EXPECT_DOUBLE_EQ(r->checkpoints.plan_interval_s, 20);
  EXPECT_EQ(r->checkpoints.mtbf_from, "incidents");
  nlohmann::json j = ReportJson(*r);
  EXPECT_EQ(j["checkpoints"]["saves"], 2);
  EXPECT_NE(ReportText(*r).find("checkpoints: 2 save(s)"), std::string::npos) << ReportText(*r);
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

// An attribution below the acting threshold is said undetermined; one read
// from a rank's log says what the node's own signals said of it.
TEST(DowntimeReportTest, TheReportSaysUndeterminedAndWhatCorroboratedTheLog) {
  auto events = OneIncident();
  events[3] = At(13.1, "attribution", 0,
                 R"({"category":"gpu_hardware","culprit_nodes":["node1"],"confidence":0.42,"determined":false,)"
                 R"("acting_threshold":0.5,"corroboration":{"log_only":true,"support":{},"unsupported":["node1"]}})");
  LiveJob live{Wall(30), "RUNNING", 1, Wall(29), 400};
  auto r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->incidents[0]["determined"], false);
  std::string text = ReportText(*r);
  EXPECT_NE(text.find("undetermined (best reading gpu_hardware, confidence 0.42 below 0.50)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("corroboration: nothing of node1's own agrees (suspected)"), std::string::npos) << text;

  events[3] = At(13.1, "attribution", 0,
                 R"j({"category":"gpu_hardware","culprit_nodes":["node1"],"confidence":0.95,"determined":true,)j"
                 R"j("corroboration":{"log_only":true,"support":{"node1":["heartbeat: GPU 1: Xid 79 (1 new)"]},)j"
                 R"j("unsupported":[]}})j");
  r = ComputeReport("j", events, &live);
  ASSERT_TRUE(r.ok());
  text = ReportText(*r);
  EXPECT_NE(text.find("gpu_hardware (software, unknown), confidence 0.95"), std::string::npos) << text;
  EXPECT_NE(text.find("corroboration: node1: heartbeat: GPU 1: Xid 79 (1 new)"), std::string::npos) << text;
}

}  // namespace
}  // namespace trainguard
