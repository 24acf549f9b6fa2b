// The node's links as the kernel counts them: per network interface
// (/sys/class/net/IF/statistics/*, carrier_changes, operstate; loopback left
// out) and per RDMA port (/sys/class/infiniband/DEV/ports/N/counters and
// state) when there are any. Cumulative counters, read each heartbeat; the
// controller turns successive readings into rates and flaps
// (controller/link_monitor.h).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace trainguard {

struct LinkReading {
  std::string name;            // "eth0", "mlx5_0/1"
  std::string kind;            // "net" or "ib"
  bool up = false;             // operstate "up" (ib: state "ACTIVE")
  std::int64_t carrier_changes = 0;  // ib: link_downed
  std::uint64_t rx_bytes = 0, tx_bytes = 0, rx_packets = 0, tx_packets = 0;
  std::uint64_t rx_dropped = 0, tx_dropped = 0, rx_errors = 0, tx_errors = 0;
};

// Reads the node's own links under `net_root` (/sys/class/net) and every
// port under `ib_root` (/sys/class/infiniband); a counter that cannot be read
// is 0. A network interface is the node's own when the kernel backs it with
// a device (a NIC: `net_root`/IF/device exists) or when it is named in
// `own_virtual` (a virtual link that carries the node's traffic: the VLAN,
// bond or container veth that holds its address; InterfacesHolding). Other
// virtual links (bridges, tunnels, veth pairs of other containers or jobs on
// the host) come and go with the host's other tenants: their carrier losses
// are no flap of this node's network, and they are left out.
std::vector<LinkReading> ReadLinks(const std::set<std::string>& own_virtual = {},
                                   const std::string& net_root = "/sys/class/net",
                                   const std::string& ib_root = "/sys/class/infiniband");

// The interfaces of this network namespace that hold `address` (a numeric
// IPv4 or IPv6 address, as the node's address is); empty for a host name,
// an address no interface holds, or when the interfaces cannot be listed.
std::set<std::string> InterfacesHolding(const std::string& address);

// TCP's segment counters of the reader's network namespace, from
// /proc/net/snmp's "Tcp:" lines (a header line of names, then one of
// values); -1 where absent.
struct TcpSegments {
  std::int64_t out = -1;      // OutSegs
  std::int64_t retrans = -1;  // RetransSegs
};
TcpSegments ParseTcpSegments(const std::string& proc_net_snmp);

// The share of segments sent between two readings that were
// retransmissions, in percent; -1 when either is unknown, the counters went
// back, or fewer than `min_segments` were sent (too few to say).
double RetransmitPercent(const TcpSegments& before, const TcpSegments& after, std::int64_t min_segments = 100);

}  // namespace trainguard
