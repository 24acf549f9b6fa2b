#include "diag/net_probe.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

TEST(NetProbeTest, MeasuresBothWaysAndTheRoundTripAgainstAPeerServer) {
  PeerServer server;
  ASSERT_TRUE(server.Start("127.0.0.1").ok());
  ASSERT_GT(server.port(), 0);
  auto figures = MeasureNetwork({"127.0.0.1:" + std::to_string(server.port())}, 4 << 20, 5 * kSecond);
  ASSERT_EQ(figures.size(), 3u);
  EXPECT_EQ(figures[0].name, "net_tx_mbps");
  EXPECT_EQ(figures[1].name, "net_rx_mbps");
  EXPECT_EQ(figures[2].name, "net_rtt_us");
  for (const auto& f : figures) {
    EXPECT_TRUE(f.error.empty()) << f.name << ": " << f.error;
    EXPECT_GT(f.value, 0) << f.name;
  }
}

TEST(NetProbeTest, TheBestNeighbourCountsAndAnUnreachableOneIsNamedOnlyWhenNoneAnswers) {
  PeerServer server;
  ASSERT_TRUE(server.Start("127.0.0.1").ok());
  const std::string good = "127.0.0.1:" + std::to_string(server.port());
  server.Stop();  // nothing listens there any more
  auto none = MeasureNetwork({good, "nonsense"}, 1 << 20, 1 * kSecond);
  EXPECT_NE(none[0].error.find("connect"), std::string::npos) << none[0].error;
  EXPECT_NE(none[0].error.find("'nonsense' is not HOST:PORT"), std::string::npos) << none[0].error;
  PeerServer live;
  ASSERT_TRUE(live.Start("127.0.0.1").ok());
  auto some = MeasureNetwork({good, "127.0.0.1:" + std::to_string(live.port())}, 1 << 20, 1 * kSecond);
  EXPECT_TRUE(some[0].error.empty()) << some[0].error;
  EXPECT_GT(some[1].value, 0);
}

TEST(NetProbeTest, TcpAnswersSaysWhetherSomethingListens) {
  PeerServer server;
  ASSERT_TRUE(server.Start("127.0.0.1").ok());
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  EXPECT_EQ(TcpAnswers(peer, 1 * kSecond), "");
  server.Stop();
  const std::string gone = TcpAnswers(peer, 1 * kSecond);
  EXPECT_NE(gone.find("Connection refused"), std::string::npos) << gone;
  EXPECT_NE(TcpAnswers("no-port", 1 * kSecond).find("not HOST:PORT"), std::string::npos);
}

}  // namespace
}  // namespace trainguard
