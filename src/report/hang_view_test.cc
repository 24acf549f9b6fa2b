// The hang view names the incident's culprit: the attribution's, once the
// incident is blamed, not the rank the detector noticed first.
#include "report/hang_view.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

Event At(const std::string& kind, int rank, const std::string& node, const nlohmann::json& detail) {
  Event e;
  e.job_id = "j";
  e.kind = kind;
  e.rank = rank;
  e.node = node;
  e.message = kind;
  e.detail_json = detail.dump();
  return e;
}

// A DDP hang without journaled buckets: rank 3 was noticed first, the
// stacks showed rank 1 outside any collective.
std::vector<Event> Hang() {
  nlohmann::json location = {{"world_size", 4}, {"layout", nlohmann::json::array()},
                             {"roots", nlohmann::json::array()}, {"desynchronized", nlohmann::json::array()},
                             {"explanation", nlohmann::json::array()}, {"has_journal", true},
                             {"ranks", nlohmann::json::array()}};
  for (int r = 0; r < 4; ++r) {
    location["ranks"].push_back({{"rank", r}, {"node", r < 2 ? "node0" : "node1"},
                                 {"state", r == 1 ? "idle" : "computing"}, {"waits_for", nlohmann::json::array()}});
  }
  return {At("failure", 3, "node1", {{"failure_kind", "hang"}, {"incident", 1}, {"location", location}}),
          At("attribution", 1, "node0",
             {{"incident", 1}, {"category", "comm_hang"}, {"culprit_ranks", {1}}, {"culprit_nodes", {"node0"}},
              {"culprit_evidence", "the stack of rank(s) 1 is outside any collective"}})};
}

TEST(HangViewTest, TheAttributionsCulpritIsTheHangsCulprit) {
  auto hang = FindHang("j", Hang(), 0);
  ASSERT_TRUE(hang.ok());
  EXPECT_EQ((*hang)["culprit_rank"], 1);
  EXPECT_EQ((*hang)["culprit_node"], "node0");
  EXPECT_EQ((*hang)["culprit_nodes"], nlohmann::json::array({"node0"}));
  EXPECT_TRUE((*hang)["blamed"].get<bool>());
  std::string text = HangText(*hang);
  EXPECT_NE(text.find("culprit: rank 1 on node0 (comm_hang): the stack of rank(s) 1"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 on node0: ROOT"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 3 on node1: ROOT"), std::string::npos) << text;
}

TEST(HangViewTest, BeforeTheBlameTheDetectorsRankIsShownAsNotYetBlamed) {
  std::vector<Event> events = Hang();
  events.pop_back();
  auto hang = FindHang("j", events, 1);
  ASSERT_TRUE(hang.ok());
  EXPECT_FALSE((*hang)["blamed"].get<bool>());
  EXPECT_NE(HangText(*hang).find("culprit: not yet blamed"), std::string::npos);
  EXPECT_FALSE(FindHang("j", events, 2).ok());
}

}  // namespace
}  // namespace trainguard
