// The fleet report on hand-made records.
#include "report/fleet_report.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

JobRecord Job(const std::string& id, const std::string& script) {
  return {id, 0, "python3 " + script, R"({"argv": ["/usr/bin/python3", ")" + script + R"(", "--lr", "0.1"]})",
          "FAILED", ""};
}

IncidentRecord Incident(const std::string& job, const std::string& node, int rank, const std::string& category,
                        const std::string& rule, std::int64_t step) {
  return {job, 1, 0, node, rank, category, rule, "restart", step, "{}"};
}

TEST(FleetReportTest, CountsAndTheTwoPatternsAcrossJobs) {
  std::vector<JobRecord> jobs = {Job("mon", "train.py"), Job("tue", "train.py"), Job("wed", "eval.py")};
  std::vector<IncidentRecord> incidents = {
      Incident("mon", "n7", 0, "network", "nccl-timeout", 100),
      Incident("wed", "n7", 3, "network", "nccl-timeout", 5),       // the same rule on n7 in another job
      Incident("mon", "n1", 2, "other", "segfault", 12),
      Incident("tue", "n4", 2, "other", "segfault", 12),            // the same program, rank and step elsewhere
      Incident("tue", "n4", 1, "user_code", "python-exception", 3),
      Incident("wed", "n4", 0, "user_code", "python-exception", 9),  // user code: never the node's pattern
  };
  FleetReport r = ComputeFleetReport(jobs, incidents);
  EXPECT_EQ(r.jobs, 3);
  EXPECT_EQ(r.incidents, 6);
  ASSERT_EQ(r.recurring.size(), 2u);
  EXPECT_EQ(r.recurring[0].points_to, "program");
  EXPECT_EQ(r.recurring[0].program, "train.py");
  EXPECT_EQ(r.recurring[0].nodes, (std::set<std::string>{"n1", "n4"}));
  EXPECT_EQ(r.recurring[1].points_to, "node");
  EXPECT_EQ(r.recurring[1].node, "n7");
  EXPECT_EQ(r.recurring[1].jobs, (std::set<std::string>{"mon", "wed"}));
  ASSERT_FALSE(r.by_node.empty());
  EXPECT_EQ(r.by_node[0].key, "n4");  // most incidents first
  EXPECT_EQ(r.by_node[0].incidents, 3);
  EXPECT_EQ(r.by_category[0].incidents, 2);
  const std::string text = FleetReportText(r);
  EXPECT_NE(text.find("node n7: network (nccl-timeout) in 2 jobs (mon, wed): the node"), std::string::npos) << text;
  EXPECT_NE(text.find("train.py: other (segfault) of rank 2 at step 12 in 2 jobs (mon, tue) on nodes n1, n4: "
                      "the program"),
            std::string::npos)
      << text;
  EXPECT_EQ(FleetReportJson(r)["recurring"].size(), 2u);
}

TEST(FleetReportTest, AnEmptyStoreIsAReportOfNothing) {
  FleetReport r = ComputeFleetReport({}, {});
  EXPECT_EQ(FleetReportText(r), "0 incident(s) in 0 job(s)\n");
}

}  // namespace
}  // namespace trainguard
