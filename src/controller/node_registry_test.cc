#include "controller/node_registry.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

JobNode Node(const std::string& id, std::uint64_t conn, int group_rank) {
  JobNode n;
  n.node_id = id;
  n.conn = conn;
  n.group_rank = group_rank;
  return n;
}

// The indexes remember where they found a node; a removal shifts the nodes
// after it, and a lookup finds each one where it is now, never a neighbour.
TEST(NodeRegistryTest, LookupsFollowTheNodesWhenOneIsRemoved) {
  NodeRegistry nodes;
  for (int i = 0; i < 5; ++i) nodes.Add(Node("node" + std::to_string(i), 10 + i, i));
  ASSERT_NE(nodes.ByConn(13), nullptr);  // remembered at index 3
  ASSERT_NE(nodes.ById("node4"), nullptr);
  EXPECT_TRUE(nodes.Remove("node1"));
  EXPECT_FALSE(nodes.Remove("node1"));
  ASSERT_EQ(nodes.size(), 4u);
  ASSERT_NE(nodes.ByConn(13), nullptr);
  EXPECT_EQ(nodes.ByConn(13)->node_id, "node3");
  EXPECT_EQ(nodes.ById("node4")->conn, 14u);
  EXPECT_EQ(nodes.ById("node1"), nullptr);
  EXPECT_EQ(nodes.ByConn(11), nullptr);
  EXPECT_EQ(nodes.ByConn(0), nullptr);  // no connection is nobody's
  // A node whose connection closed (conn 0) and came back on another.
  nodes.ById("node3")->conn = 0;
  EXPECT_EQ(nodes.ByConn(13), nullptr);
  nodes.ById("node3")->conn = 23;
  EXPECT_EQ(nodes.ByConn(23)->node_id, "node3");
}

TEST(NodeRegistryTest, IdleSparesAreConnectedNodesWithoutAGroupRank) {
  NodeRegistry nodes;
  nodes.Add(Node("a", 1, 0));
  nodes.Add(Node("spare1", 2, -1));
  nodes.Add(Node("spare2", 0, -1));  // gone
  nodes.Add(Node("", 3, -1));         // connected, not registered
  EXPECT_EQ(nodes.IdleSpares(), 1);
  nodes.ById("a")->ranks[5] = RankView{};
  EXPECT_EQ(nodes.NodeOfRank(5), "a");
  EXPECT_EQ(nodes.NodeOfRank(6), "");
}

}  // namespace
}  // namespace trainguard
