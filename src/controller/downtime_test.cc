#include "controller/downtime.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace trainguard {
namespace {

Incident Crash() {
  Incident inc;
  inc.number = 2;
  inc.kind = FindingKind::kRankFailed;
  inc.fault_wall = 100 * kSecond;
  inc.detected_wall = inc.fault_wall + 12 * kMillisecond;
  inc.stopped_wall = inc.detected_wall + 1204 * kMillisecond;
  inc.failure_step = 57;
  inc.checkpoint_step = 50;
  return inc;
}

TEST(DowntimeTest, EveryTermOfAnIncidentThatRestarted) {
  Incident inc = Crash();
  DowntimeRecord r = DescribeDowntime(inc, inc.stopped_wall + 3 * kSecond);
  auto d = nlohmann::json::parse(r.json);
  EXPECT_EQ(d["detection_ms"], 12);
  EXPECT_EQ(d["shutdown_ms"], 1204);
  EXPECT_EQ(d["restart_ms"], 3000);
  EXPECT_EQ(d["lost_steps"], 7);
  EXPECT_EQ(r.line,
            "incident 2 (rank_failed): detection 0.012 s, shutdown 1.204 s, restart 3.000 s, lost 7 step(s) "
            "(failed at 57, checkpoint 50)");
}

TEST(DowntimeTest, WhatWasNeverSeenIsUnknownNotZero) {
  Incident inc = Crash();
  inc.stopped_wall = 0;  // never stopped (the job ended)
  DowntimeRecord r = DescribeDowntime(inc, 0);
  auto d = nlohmann::json::parse(r.json);
  EXPECT_EQ(d["shutdown_ms"], -1);
  EXPECT_EQ(d["restart_ms"], -1);
  EXPECT_NE(r.line.find("shutdown unknown, restart unknown"), std::string::npos) << r.line;

  inc.failure_step = -1;  // no progress data at all
  d = nlohmann::json::parse(DescribeDowntime(inc, 0).json);
  EXPECT_TRUE(d["lost_steps"].is_null());
  EXPECT_NE(DescribeDowntime(inc, 0).line.find("lost work unknown"), std::string::npos);
}

TEST(DowntimeTest, WithoutACheckpointLostWorkCountsFromStepZero) {
  Incident inc = Crash();
  inc.checkpoint_step = -1;
  DowntimeRecord r = DescribeDowntime(inc, 0);
  EXPECT_EQ(nlohmann::json::parse(r.json)["lost_steps"], 57);
  EXPECT_NE(r.line.find("no checkpoint reported: counted from step 0"), std::string::npos) << r.line;
}

TEST(DowntimeTest, RestartSplitsIntoTermsThatAddUp) {
  Incident inc = Crash();
  RestartPath p;
  p.first_step_wall = inc.stopped_wall + 3000 * kMillisecond;
  p.generation_start_wall = inc.stopped_wall + 100 * kMillisecond;  // rendezvous 100 ms
  // The rank was launched 20 ms after the start order: its first step at
  // 2880 ms of its own clock.
  p.script_start_ms = 80;
  p.pg_init_begin_ms = 1000;
  p.pg_init_end_ms = 1300;
  p.restore_begin_ms = 1400;
  p.restore_end_ms = 1900;
  p.first_step_ms = 2880;
  p.warm = true;
  auto d = nlohmann::json::parse(DescribeDowntime(inc, p).json);
  const auto& t = d["restart_terms"];
  EXPECT_EQ(t["rendezvous_ms"], 100);
  EXPECT_EQ(t["process_start_ms"], 100);  // 20 ms to launch + 80 ms to the script
  EXPECT_EQ(t["imports_ms"], 920);
  EXPECT_EQ(t["pg_init_ms"], 300);
  EXPECT_EQ(t["restore_ms"], 500);
  EXPECT_EQ(t["first_step_ms"], 1080);
  EXPECT_EQ(t["warm"], true);
  std::int64_t sum = 0;
  for (const char* k : {"rendezvous_ms", "process_start_ms", "imports_ms", "pg_init_ms", "restore_ms", "first_step_ms"}) {
    sum += t[k].get<std::int64_t>();
  }
  EXPECT_EQ(sum, d["restart_ms"].get<std::int64_t>());
}

TEST(DowntimeTest, AWaitForTheStandbysImportsIsATermOfItsOwn) {
  Incident inc = Crash();
  RestartPath p;
  p.first_step_wall = inc.stopped_wall + 1500 * kMillisecond;
  p.generation_start_wall = inc.stopped_wall + 100 * kMillisecond;
  // Launched 20 ms after the order; it waited 700 ms for its standby, which
  // then became the rank in 10 ms.
  p.standby_wait_ms = 700;
  p.script_start_ms = 710;
  p.pg_init_begin_ms = 750;
  p.pg_init_end_ms = 900;
  p.first_step_ms = 1380;
  p.warm = true;
  DowntimeRecord r = DescribeDowntime(inc, p);
  auto d = nlohmann::json::parse(r.json);
  const auto& t = d["restart_terms"];
  EXPECT_EQ(t["standby_wait_ms"], 700);
  EXPECT_EQ(t["process_start_ms"], 30);  // 20 ms to launch + 10 ms to hand over
  EXPECT_EQ(t["imports_ms"], 40);
  std::int64_t sum = 0;
  for (const auto& [k, v] : t.items()) {
    if (k.ends_with("_ms")) sum += v.get<std::int64_t>();
  }
  EXPECT_EQ(sum, d["restart_ms"].get<std::int64_t>());
  EXPECT_NE(r.line.find("rendezvous 0.100 + standby wait 0.700 + process start 0.030"), std::string::npos) << r.line;
  // A wait reported longer than the launch-to-script time is cut to it: the terms still add up.
  p.standby_wait_ms = 5000;
  d = nlohmann::json::parse(DescribeDowntime(inc, p).json);
  EXPECT_EQ(d["restart_terms"]["standby_wait_ms"], 710);
  EXPECT_EQ(d["restart_terms"]["process_start_ms"], 20);
}

TEST(DowntimeTest, MarksNotReportedFoldIntoTheNextTerm) {
  Incident inc = Crash();
  RestartPath p;
  p.first_step_wall = inc.stopped_wall + 2 * kSecond;
  p.generation_start_wall = inc.stopped_wall;
  p.first_step_ms = 2000;  // an uninstrumented start: only the first step
  auto d = nlohmann::json::parse(DescribeDowntime(inc, p).json);
  EXPECT_EQ(d["restart_terms"]["imports_ms"], 2000);
  EXPECT_EQ(d["restart_terms"]["pg_init_ms"], 0);
  EXPECT_EQ(d["restart_terms"]["restore_ms"], 0);
  RestartPath none;
  none.first_step_wall = p.first_step_wall;
  EXPECT_FALSE(nlohmann::json::parse(DescribeDowntime(inc, none).json).contains("restart_terms"));
}

TEST(DowntimeTest, LostWorkCountsFromTheCheckpointTheRanksResumedFrom) {
  Incident inc = Crash();  // failed at 57, the newest commit the controller saw: 50
  RestartPath p;
  p.first_step_wall = inc.stopped_wall + kSecond;
  p.resumed_step = 55;  // committed just before the failure, after the last heartbeat
  DowntimeRecord r = DescribeDowntime(inc, p);
  EXPECT_EQ(nlohmann::json::parse(r.json)["lost_steps"], 2);
  EXPECT_NE(r.line.find("lost 2 step(s) (failed at 57, resumed from checkpoint 55)"), std::string::npos) << r.line;
  p.resumed_step = 40;  // the newest was unusable: an older one was loaded
  EXPECT_EQ(nlohmann::json::parse(DescribeDowntime(inc, p).json)["lost_steps"], 17);
}

}  // namespace
}  // namespace trainguard
