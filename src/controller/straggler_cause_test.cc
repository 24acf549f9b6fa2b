#include "controller/straggler_cause.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

std::map<std::string, NodeCpu> Nodes(NodeCpu slow) {
  std::map<std::string, NodeCpu> m;
  for (int i = 0; i < 4; ++i) m["node" + std::to_string(i)] = {0, 0.5, 3.0, 8};
  m["node2"] = slow;
  return m;
}

TEST(StragglerCauseTest, NamesTheCpuQuotaTheStealOrTheLoadThatSetTheNodeApart) {
  EXPECT_EQ(CpuSlowCause("node2", Nodes({48, 0.4, 3.0, 8})),
            "its ranks' cgroup was throttled by its CPU quota 48 % of the time (the other nodes: 0 %)");
  EXPECT_EQ(CpuSlowCause("node2", Nodes({0, 31, 3.0, 8})),
            "the hypervisor took 31 % of its CPU time (steal; the other nodes: 0 %)");
  EXPECT_EQ(CpuSlowCause("node2", Nodes({0, 0.5, 20.0, 8})), "load 20.0 on 8 CPUs (the other nodes: 0.4 per CPU)");
  const std::string both = CpuSlowCause("node2", Nodes({60, 25, 3.0, 8}));
  EXPECT_NE(both.find("CPU quota 60 %"), std::string::npos) << both;
  EXPECT_NE(both.find("; the hypervisor took 25 %"), std::string::npos) << both;
}

TEST(StragglerCauseTest, NothingWhenTheNodeLooksLikeTheOthersOrIsUnknown) {
  EXPECT_EQ(CpuSlowCause("node2", Nodes({0, 0.5, 3.0, 8})), "");
  EXPECT_EQ(CpuSlowCause("node2", Nodes({-1, -1, 0, 0})), "");  // the first heartbeat: unknown
  EXPECT_EQ(CpuSlowCause("node9", Nodes({48, 0, 3, 8})), "");    // no figures for it
  // Every node equally throttled: not what sets this one apart.
  std::map<std::string, NodeCpu> all;
  for (int i = 0; i < 4; ++i) all["node" + std::to_string(i)] = {50, 0, 3, 8};
  EXPECT_EQ(CpuSlowCause("node2", all), "");
}

TEST(NetworkSlowCauseTest, RetransmissionsErrorsAndFlapsThatStandOutAreNamed) {
  std::map<std::string, NodeNet> all = {{"node0", {0.0, 0, 0}}, {"node1", {6.8, 0, 0}}, {"node2", {0.1, 0, 0}}};
  EXPECT_EQ(NetworkSlowCause("node1", all), "TCP retransmitted 6.8 % of its segments (the other nodes: 0.1 %)");
  EXPECT_EQ(NetworkSlowCause("node0", all), "");
  // Everyone retransmits alike: the path, not this node.
  all = {{"node0", {2.0, 0, 0}}, {"node1", {2.5, 0, 0}}, {"node2", {2.2, 0, 0}}};
  EXPECT_EQ(NetworkSlowCause("node1", all), "");
  // Drops and errors, and carrier losses, joined.
  all = {{"node0", {0, 0, 0}}, {"node1", {-1, 250, 2}}, {"node2", {0, 1, 0}}};
  EXPECT_EQ(NetworkSlowCause("node1", all),
            "its links dropped or errored 250 packets/s (the other nodes: 0); its links lost their carrier 2 "
            "time(s) lately");
  // Unknown figures name nothing; an unknown node neither.
  all = {{"node0", {-1, -1, 0}}, {"node1", {-1, -1, 0}}};
  EXPECT_EQ(NetworkSlowCause("node1", all), "");
  EXPECT_EQ(NetworkSlowCause("node9", all), "");
}

}  // namespace
}  // namespace trainguard
