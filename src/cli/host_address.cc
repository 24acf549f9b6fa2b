#include "cli/host_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace trainguard {

namespace {

struct Resolved {
  addrinfo* list = nullptr;
  explicit Resolved(const std::string& host) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host.c_str(), "9", &hints, &list) != 0) list = nullptr;
  }
  ~Resolved() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

std::string Numeric(const sockaddr* addr, socklen_t len) {
  char text[NI_MAXHOST] = {};
  if (getnameinfo(addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return text;
}

}  // namespace

void SplitHostPort(const std::string& endpoint, std::string* host, int* port) {
  *port = -1;
  std::string h = endpoint;
  std::size_t colon = endpoint.rfind(':');
  bool bracketed = !endpoint.empty() && endpoint[0] == '[';
  if (colon != std::string::npos && (!bracketed || endpoint.rfind(']') < colon) &&
      (bracketed || endpoint.find(':') == colon)) {
    h = endpoint.substr(0, colon);
    std::string p = endpoint.substr(colon + 1);
    char* end = nullptr;
    long n = std::strtol(p.c_str(), &end, 10);
    if (!p.empty() && end != nullptr && *end == '\0' && n >= 0 && n <= 65535) *port = static_cast<int>(n);
  }
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = h;
}

bool IsLocalAddress(const std::string& host) {
  Resolved r(host);
  for (addrinfo* a = r.list; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // Port 0: any free one; binding only checks that the address is ours.
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    if (addr.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    bool ours = bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) == 0;
    close(fd);
    if (ours) return true;
  }
  return false;
}

bool CanListenOnPort(int port, bool v6) {
  int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC's listener
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(static_cast<std::uint16_t>(port));
    len = sizeof(*a);
  }
  bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
  close(fd);
  return free;
}

std::string LocalAddressToward(const std::string& host) {
  Resolved r(host);
  for (addrinfo* a = r.list; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // A datagram socket's connect sends nothing; it only picks the route.
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    std::string found;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      found = Numeric(reinterpret_cast<sockaddr*>(&local), len);
    }
    close(fd);
    if (!found.empty()) return found;
  }
  return "";
}

}  // namespace trainguard
