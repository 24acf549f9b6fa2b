#include "diag/net_probe.h"

#include "common/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace trainguard {

namespace {

Nanos Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Sends or receives `total` bytes in 1 MiB pieces.
bool Stream(int fd, std::int64_t total, bool sending) {
  static thread_local std::vector<char> block(1 << 20, 'n');
  while (total > 0) {
    std::size_t n = static_cast<std::size_t>(std::min<std::int64_t>(total, static_cast<std::int64_t>(block.size())));
    if (!(sending ? SendAll(fd, block.data(), n) : RecvAll(fd, block.data(), n))) return false;
    total -= static_cast<std::int64_t>(n);
  }
  return true;
}

void Serve(int fd) {
  SetDeadline(fd, 60 * kSecond);
  char op = 0;
  while (RecvAll(fd, &op, 1)) {
    if (op == 'P') {  // ping
      if (!SendAll(fd, &op, 1)) break;
      continue;
    }
    std::int64_t n = 0;
    if (!RecvAll(fd, reinterpret_cast<char*>(&n), sizeof(n)) || n < 0 || n > (1ll << 32)) break;
    if (op == 'U') {  // the client uploads n bytes; acknowledge when all arrived
      if (!Stream(fd, n, false) || !SendAll(fd, &op, 1)) break;
    } else if (op == 'D') {  // the client downloads n bytes
      if (!Stream(fd, n, true)) break;
    } else {
      break;
    }
  }
  close(fd);
}

}  // namespace

PeerServer::~PeerServer() { Stop(); }

Status PeerServer::Start(const std::string& address) {
  std::string error;
  listen_fd_ = Listen(address, &port_, &error);
  if (listen_fd_ < 0) return IoError("diagnostics peer server on " + error);
  accept_thread_ = std::thread([this] {
    while (!stopping_.load()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) != 1) continue;
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) std::thread(Serve, fd).detach();
    }
  });
  return Status::Ok();
}

void PeerServer::Stop() {
  stopping_.store(true);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

std::string TcpAnswers(const std::string& peer, Nanos timeout) {
  std::string error;
  int fd = Connect(peer, timeout, &error);
  if (fd < 0) return error.empty() ? peer + ": no answer" : error;
  close(fd);
  return "";
}

std::vector<Figure> MeasureNetwork(const std::vector<std::string>& peers, std::int64_t bytes, Nanos deadline) {
  Figure tx{"net_tx_mbps", 0, ""}, rx{"net_rx_mbps", 0, ""}, rtt{"net_rtt_us", 0, ""};
  std::string errors;
  double best_rtt = -1;
  for (const auto& peer : peers) {
    std::string error;
    int fd = Connect(peer, deadline, &error);
    if (fd < 0) {
      errors += (errors.empty() ? "" : "; ") + error;
      continue;
    }
    bool ok = true;
    // Round trips first (an idle connection), then the two bulk transfers.
    for (int i = 0; i < 20 && ok; ++i) {
      char op = 'P';
      const Nanos t0 = Now();
      ok = SendAll(fd, &op, 1) && RecvAll(fd, &op, 1);
      const double us = static_cast<double>(Now() - t0) / 1000;
      if (ok && (best_rtt < 0 || us < best_rtt)) best_rtt = us;
    }
    const double mib = static_cast<double>(bytes) / (1 << 20);
    if (ok) {
      char op = 'U';
      const Nanos t0 = Now();
      ok = SendAll(fd, &op, 1) && SendAll(fd, reinterpret_cast<const char*>(&bytes), sizeof(bytes)) &&
           Stream(fd, bytes, true) && RecvAll(fd, &op, 1);
      if (ok) tx.value = std::max(tx.value, mib / (static_cast<double>(Now() - t0) / kSecond));
    }
    if (ok) {
      char op = 'D';
      const Nanos t0 = Now();
      ok = SendAll(fd, &op, 1) && SendAll(fd, reinterpret_cast<const char*>(&bytes), sizeof(bytes)) &&
           Stream(fd, bytes, false);
      if (ok) rx.value = std::max(rx.value, mib / (static_cast<double>(Now() - t0) / kSecond));
    }
    if (!ok) errors += (errors.empty() ? "" : "; ") + peer + ": " + std::strerror(errno);
    close(fd);
  }
  if (tx.value == 0) tx.error = errors.empty() ? "no peer measured" : errors;
  if (rx.value == 0) rx.error = errors.empty() ? "no peer measured" : errors;
  if (best_rtt < 0) {
    rtt.error = errors.empty() ? "no peer measured" : errors;
  } else {
    rtt.value = best_rtt;
  }
  return {tx, rx, rtt};
}

}  // namespace trainguard
