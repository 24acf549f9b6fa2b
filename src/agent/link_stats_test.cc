#include "agent/link_stats.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/small_file.h"
#include "testing/scratch_dir.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;

void FakeLink(const fs::path& net_root, const std::string& name, bool device, int carrier_changes) {
  fs::create_directories(net_root / name / "statistics");
  if (device) fs::create_directories(net_root / name / "device");
  std::ofstream(net_root / name / "operstate") << "up\n";
  std::ofstream(net_root / name / "carrier_changes") << carrier_changes << "\n";
  std::ofstream(net_root / name / "statistics" / "rx_bytes") << "1000\n";
}

// Found in the field of parallel tests: an agent in the host's namespace
// counted another job's veth pairs, deleted as that job ended, as flaps of
// its own node and evicted it. Only NICs and the virtual links that hold the
// node's address are the node's.
TEST(ReadLinksTest, NicsAndTheVirtualLinksThatCarryTheNodesAddressNotOtherTenantsLinks) {
  testutil::ScratchDir dir("read_links_test");
  const fs::path net = dir / "net";
  FakeLink(net, "eth0", /*device=*/true, 2);
  FakeLink(net, "lo", false, 0);
  FakeLink(net, "veth1a2b", false, 7);   // another container's
  FakeLink(net, "tgb123456", false, 3);  // a bridge of another job
  FakeLink(net, "tg0", false, 4);        // the node's own, in its namespace
  std::vector<std::string> names;
  for (const LinkReading& r : ReadLinks({"tg0"}, net.string(), dir / "no-infiniband")) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"eth0", "tg0"}));
  auto nics = ReadLinks({}, net.string(), dir / "no-infiniband");
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].name, "eth0");
  EXPECT_EQ(nics[0].carrier_changes, 2);
  EXPECT_EQ(nics[0].rx_bytes, 1000u);
  EXPECT_TRUE(nics[0].up);
}

TEST(ReadLinksTest, TheInterfacesThatHoldAnAddress) {
  EXPECT_EQ(InterfacesHolding("127.0.0.1"), std::set<std::string>{"lo"});
  EXPECT_TRUE(InterfacesHolding("192.0.2.77").empty());  // TEST-NET-1: nobody's
  EXPECT_TRUE(InterfacesHolding("node7.example").empty());
  EXPECT_TRUE(InterfacesHolding("").empty());
}

// /proc/net/snmp's layout: a header line of names, then one of values, per protocol.
const char* kSnmp =
    "Ip: Forwarding DefaultTTL InReceives\n"
    "Ip: 1 64 2152308\n"
    "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs "
    "OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
    "Tcp: 1 200 120000 -1 7600 5462 2127 63 0 2152308 2148914 1298 0 2183 0\n"
    "Udp: InDatagrams NoPorts\n"
    "Udp: 10 2\n";

TEST(TcpSegmentsTest, OutAndRetransmittedSegmentsByName) {
  TcpSegments t = ParseTcpSegments(kSnmp);
  EXPECT_EQ(t.out, 2148914);
  EXPECT_EQ(t.retrans, 1298);
  TcpSegments none = ParseTcpSegments("Ip: Forwarding\nIp: 1\n");
  EXPECT_EQ(none.out, -1);
  EXPECT_EQ(none.retrans, -1);
  EXPECT_EQ(ParseTcpSegments("Tcp: OutSegs RetransSegs\nTcp: x 7\n").out, -1);  // not a number
}

TEST(TcpSegmentsTest, TheRetransmittedShareBetweenTwoReadings) {
  EXPECT_DOUBLE_EQ(RetransmitPercent({1000, 10}, {6000, 360}), 7.0);
  EXPECT_EQ(RetransmitPercent({1000, 10}, {1050, 20}), -1);  // 50 segments: too few to say
  EXPECT_EQ(RetransmitPercent({-1, -1}, {6000, 360}), -1);  // the first reading
  EXPECT_EQ(RetransmitPercent({6000, 360}, {1000, 10}), -1);  // counters went back (another namespace)
}

TEST(TcpSegmentsTest, ThisMachinesOwnCountersParse) {
  TcpSegments t = ParseTcpSegments(ReadSmallFile("/proc/net/snmp"));
  EXPECT_GE(t.out, 0);
  EXPECT_GE(t.retrans, 0);
}

}  // namespace
}  // namespace trainguard
