#include "controller/fleet_failure_rate.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

JobRecord Ended(const std::string& id, int nnodes, int nproc, double hours, const std::string& state = "SUCCEEDED") {
  JobRecord j;
  j.job_id = id;
  j.created_wall_ns = 1000 * kSecond;
  j.ended_wall_ns = j.created_wall_ns + static_cast<Nanos>(hours * 3600 * kSecond);
  j.config_json = "{\"nnodes\": " + std::to_string(nnodes) + ", \"nproc_per_node\": " + std::to_string(nproc) + "}";
  j.state = state;
  return j;
}

IncidentRecord Incident(const std::string& job) {
  IncidentRecord i;
  i.job_id = job;
  return i;
}

TEST(FleetFailureRateTest, CountsTheIncidentsOfEndedJobsPerGpuHourTheyHeld) {
  std::vector<JobRecord> jobs{Ended("a", 2, 8, 10), Ended("b", 1, 4, 5, "FAILED")};
  JobRecord running = Ended("c", 100, 8, 1);
  running.state = "RUNNING";
  running.ended_wall_ns = 0;
  JobRecord old = Ended("d", 1, 8, 3);
  old.ended_wall_ns = 0;  // ended before end times were kept: its GPU-hours are unknown
  JobRecord self = Ended("me", 4, 8, 2);
  jobs.insert(jobs.end(), {running, old, self});
  std::vector<IncidentRecord> incidents{Incident("a"), Incident("a"), Incident("b"), Incident("c"), Incident("d"),
                                        Incident("me")};
  FleetFailureRate fleet = ReadFleetFailureRate(jobs, incidents, "me");
  EXPECT_EQ(fleet.jobs, 2);
  EXPECT_DOUBLE_EQ(fleet.gpu_hours, 160 + 20);
  EXPECT_EQ(fleet.failures, 3);
  EXPECT_DOUBLE_EQ(fleet.PerGpuHour(), 3.0 / 180);
  EXPECT_EQ(fleet.Describe(), "3 failure(s) in 180 GPU-hours of 2 job(s) in this store");
}

TEST(FleetFailureRateTest, NothingEndedIsNoRate) {
  JobRecord bad = Ended("x", 1, 1, 1);
  bad.config_json = "not json";
  FleetFailureRate fleet = ReadFleetFailureRate({bad}, {Incident("x")}, "");
  EXPECT_EQ(fleet.jobs, 0);
  EXPECT_EQ(fleet.failures, 0);
  EXPECT_EQ(fleet.PerGpuHour(), 0);
}

}  // namespace
}  // namespace trainguard
