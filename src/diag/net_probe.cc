#include "diag/net_probe.h"

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

void SetDeadline(int fd, Nanos timeout) {
  timeval tv{static_cast<time_t>(timeout / kSecond), static_cast<suseconds_t>((timeout % kSecond) / 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool SendAll(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool RecvAll(int fd, char* data, std::size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, data, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    data += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
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

int Connect(const std::string& peer, Nanos timeout, std::string* error) {
  auto colon = peer.rfind(':');
  if (colon == std::string::npos) {
    *error = "peer '" + peer + "' is not HOST:PORT";
    return -1;
  }
  std::string host = peer.substr(0, colon), port = peer.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    *error = peer + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    *error = peer + ": socket: " + std::strerror(errno);
    return -1;
  }
  int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, static_cast<int>(timeout / kMillisecond)) == 1 ? 0 : -1;
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)) {
      errno = err;
      rc = -1;
    } else if (rc != 0) {
      errno = ETIMEDOUT;
    }
  }
  if (rc != 0) {
    *error = peer + ": connect: " + std::strerror(errno);
    close(fd);
    return -1;
  }
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  SetDeadline(fd, timeout);
  return fd;
}

}  // namespace

PeerServer::~PeerServer() { Stop(); }

Status PeerServer::Start(const std::string& address) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) addr.sin_addr.s_addr = htonl(INADDR_ANY);
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return IoError("diagnostics peer server: socket: " + std::string(std::strerror(errno)));
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listen_fd_, 16) != 0) {
    std::string e = std::strerror(errno);
    close(listen_fd_);
    listen_fd_ = -1;
    return IoError("diagnostics peer server on " + address + ": " + e);
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
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
