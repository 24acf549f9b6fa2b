#include "controller/link_monitor.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

v1::LinkStats Link(const std::string& name, bool up, std::int64_t carrier_changes, std::uint64_t bytes) {
  v1::LinkStats l;
  l.set_name(name);
  l.set_up(up);
  l.set_carrier_changes(carrier_changes);
  l.set_rx_bytes(bytes);
  l.set_tx_bytes(bytes);
  return l;
}

std::vector<std::string> Kinds(const std::vector<LinkObservation>& obs) {
  std::vector<std::string> out;
  for (const auto& o : obs) out.push_back(EventKindName(o.kind));
  return out;
}

TEST(LinkMonitorTest, AFlapShorterThanAHeartbeatIsCountedFromTheCarrierChanges) {
  LinkMonitor m;
  EXPECT_TRUE(m.Update("n0", {Link("tg0", true, 1, 1000)}, 1 * kSecond).empty());
  // Down and up again between two heartbeats: both readings say up.
  auto obs = m.Update("n0", {Link("tg0", true, 3, 2000)}, 2 * kSecond);
  ASSERT_EQ(Kinds(obs), std::vector<std::string>{"link_flap"});
  EXPECT_EQ(obs[0].flaps_in_window, 1);
  EXPECT_DOUBLE_EQ(m.BytesPerSecond("n0"), 2000);
}

TEST(LinkMonitorTest, DownAndUpAreReportedAndRepeatedFlapsMakeTheNodeFlappingOnce) {
  LinkMonitor m({600 * kSecond, 3, 10 * kSecond, 10e3});
  m.Update("n0", {Link("tg0", true, 1, 0)}, 0);
  EXPECT_EQ(Kinds(m.Update("n0", {Link("tg0", false, 2, 0)}, 1 * kSecond)),
            (std::vector<std::string>{"link_down", "link_flap"}));
  EXPECT_EQ(Kinds(m.Update("n0", {Link("tg0", true, 3, 0)}, 2 * kSecond)), std::vector<std::string>{"link_up"});
  EXPECT_EQ(Kinds(m.Update("n0", {Link("tg0", true, 5, 0)}, 3 * kSecond)), std::vector<std::string>{"link_flap"});
  auto third = m.Update("n0", {Link("tg0", true, 7, 0)}, 4 * kSecond);
  ASSERT_EQ(Kinds(third), (std::vector<std::string>{"link_flap", "link_flapping"}));
  EXPECT_EQ(third[1].flaps_in_window, 3);
  EXPECT_NE(third[1].message.find("flapped 3 times"), std::string::npos) << third[1].message;
  EXPECT_EQ(Kinds(m.Update("n0", {Link("tg0", true, 9, 0)}, 5 * kSecond)), std::vector<std::string>{"link_flap"});
}

TEST(LinkMonitorTest, FlapsOutsideTheWindowDoNotAddUp) {
  LinkMonitor m({60 * kSecond, 3, 10 * kSecond, 10e3});
  m.Update("n0", {Link("tg0", true, 0, 0)}, 0);
  m.Update("n0", {Link("tg0", true, 2, 0)}, 1 * kSecond);
  m.Update("n0", {Link("tg0", true, 4, 0)}, 100 * kSecond);
  auto obs = m.Update("n0", {Link("tg0", true, 6, 0)}, 120 * kSecond);
  ASSERT_EQ(Kinds(obs), std::vector<std::string>{"link_flap"});
  EXPECT_EQ(obs[0].flaps_in_window, 2);
}

TEST(LinkMonitorTest, ANodeWhoseTrafficStopsWhileItsPeersMoveIsSilentAndCountersStartingOverAreNoFlap) {
  LinkMonitor m({600 * kSecond, 3, 5 * kSecond, 10e3});
  std::uint64_t busy = 0;
  std::vector<LinkObservation> silent;
  for (int t = 0; t <= 8; ++t) {
    busy += 1000000;
    m.Update("n1", {Link("tg0", true, 1, busy)}, t * kSecond);
    auto obs = m.Update("n0", {Link("tg0", true, 1, t < 2 ? busy : 2000000)}, t * kSecond);
    for (auto& o : obs) silent.push_back(o);
  }
  ASSERT_EQ(Kinds(silent), std::vector<std::string>{"link_silent"});  // once
  EXPECT_EQ(silent[0].node, "n0");
  // The agent's interface was made anew: counters start over, no flap, no rate.
  EXPECT_TRUE(m.Update("n0", {Link("tg0", true, 0, 10)}, 9 * kSecond).empty());
}

TEST(LinkMonitorTest, DropsAndErrorsAreARatePerNodeAndFlapsAreCountedInTheWindow) {
  LinkMonitor m;
  EXPECT_EQ(m.ErrorsPerSecond("n0"), -1);  // unknown before two readings
  v1::LinkStats a = Link("tg0", true, 1, 1000);
  a.set_rx_dropped(10);
  a.set_tx_errors(5);
  m.Update("n0", {a}, 1 * kSecond);
  EXPECT_EQ(m.ErrorsPerSecond("n0"), -1);
  v1::LinkStats b = Link("tg0", true, 3, 2000);  // and one flap
  b.set_rx_dropped(30);
  b.set_tx_errors(15);
  b.set_rx_errors(10);
  m.Update("n0", {b}, 3 * kSecond);
  EXPECT_DOUBLE_EQ(m.ErrorsPerSecond("n0"), 20);  // 40 more in 2 s
  EXPECT_EQ(m.FlapsInWindow("n0"), 1);
  // Counters that went back (the interface was remade) give no rate.
  v1::LinkStats c = Link("tg0", true, 3, 3000);
  m.Update("n0", {c}, 4 * kSecond);
  EXPECT_DOUBLE_EQ(m.ErrorsPerSecond("n0"), 20);  // the last rate known stands
  EXPECT_EQ(m.FlapsInWindow("nobody"), 0);
}

}  // namespace
}  // namespace trainguard
