#include "agent/link_stats.h"

#include <gtest/gtest.h>

#include "common/small_file.h"

namespace trainguard {
namespace {

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
