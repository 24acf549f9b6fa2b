// The network probe of the diagnostics suite: bandwidth both ways and
// round-trip time between this node and its ring neighbours (up to four), over plain TCP to
// each neighbour's PeerServer (every agent runs one). A node's figure is
// the best over its neighbours: a slow peer lowers one pair, while a node
// whose own link is slow is slow with every neighbour, so a bad link is
// charged to its node and not to the nodes that talk to it.
//
// Figures: net_tx_mbps (this node sends), net_rx_mbps (this node receives),
// MiB/s; net_rtt_us (1-byte ping-pong, the best over neighbours; shown, not
// judged). Every socket operation has a deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "diag/probes.h"
#include "trainguard/status.h"

namespace trainguard {

// Serves the probe's other end: upload (read N bytes, acknowledge), download
// (send N bytes), ping (echo). One thread per connection, detached; Stop()
// closes the listening socket.
class PeerServer {
 public:
  PeerServer() = default;
  ~PeerServer();
  // Listens on `address`:0; the port is then port().
  Status Start(const std::string& address);
  int port() const { return port_; }
  void Stop();

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
};

// Whether something accepts a TCP connection at `peer` ("HOST:PORT") within
// `timeout`: "" if so, else why not ("10.0.0.3:6818: connect: Connection
// refused"). The connection is closed at once.
std::string TcpAnswers(const std::string& peer, Nanos timeout);

// Measures against each peer ("HOST:PORT"): `bytes` up, `bytes` down, 20
// pings. A peer that cannot be reached within `deadline` counts as no
// figure; with no peer measured, the figures carry the errors.
std::vector<Figure> MeasureNetwork(const std::vector<std::string>& peers, std::int64_t bytes, Nanos deadline);

}  // namespace trainguard
