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

}  // namespace
}  // namespace trainguard
