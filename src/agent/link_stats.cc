#include "agent/link_stats.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace trainguard {

namespace fs = std::filesystem;

namespace {

std::string ReadWord(const fs::path& p) {
  std::ifstream f(p);
  std::string w;
  f >> w;
  return w;
}

std::uint64_t ReadCount(const fs::path& p) {
  std::ifstream f(p);
  std::uint64_t v = 0;
  f >> v;
  return f ? v : 0;
}

}  // namespace

std::vector<LinkReading> ReadLinks(const std::set<std::string>& own_virtual, const std::string& net_root,
                                   const std::string& ib_root) {
  std::vector<LinkReading> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(net_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "lo") continue;
    const fs::path dir = entry.path();
    std::error_code device_ec;
    if (!fs::exists(dir / "device", device_ec) && !own_virtual.count(name)) continue;
    const fs::path stats = dir / "statistics";
    LinkReading r;
    r.name = name;
    r.kind = "net";
    r.up = ReadWord(dir / "operstate") == "up";
    r.carrier_changes = static_cast<std::int64_t>(ReadCount(dir / "carrier_changes"));
    r.rx_bytes = ReadCount(stats / "rx_bytes");
    r.tx_bytes = ReadCount(stats / "tx_bytes");
    r.rx_packets = ReadCount(stats / "rx_packets");
    r.tx_packets = ReadCount(stats / "tx_packets");
    r.rx_dropped = ReadCount(stats / "rx_dropped");
    r.tx_dropped = ReadCount(stats / "tx_dropped");
    r.rx_errors = ReadCount(stats / "rx_errors");
    r.tx_errors = ReadCount(stats / "tx_errors");
    out.push_back(std::move(r));
  }
  for (const auto& dev : fs::directory_iterator(ib_root, ec)) {
    std::error_code port_ec;
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", port_ec)) {
      const fs::path counters = port.path() / "counters";
      LinkReading r;
      r.name = dev.path().filename().string() + "/" + port.path().filename().string();
      r.kind = "ib";
      {
        std::ifstream f(port.path() / "state");  // "4: ACTIVE"
        std::string line;
        std::getline(f, line);
        r.up = line.find("ACTIVE") != std::string::npos;
      }
      r.carrier_changes = static_cast<std::int64_t>(ReadCount(counters / "link_downed"));
      // The data counters count 4-byte words (the IB spec's PortXmitData).
      r.rx_bytes = ReadCount(counters / "port_rcv_data") * 4;
      r.tx_bytes = ReadCount(counters / "port_xmit_data") * 4;
      r.rx_packets = ReadCount(counters / "port_rcv_packets");
      r.tx_packets = ReadCount(counters / "port_xmit_packets");
      r.rx_dropped = ReadCount(counters / "port_rcv_discards");
      r.tx_dropped = ReadCount(counters / "port_xmit_discards");
      r.rx_errors = ReadCount(counters / "port_rcv_errors") + ReadCount(counters / "symbol_error");
      r.tx_errors = ReadCount(counters / "port_xmit_constraint_errors");
      out.push_back(std::move(r));
    }
  }
  std::sort(out.begin(), out.end(), [](const LinkReading& a, const LinkReading& b) { return a.name < b.name; });
  return out;
}

TcpSegments ParseTcpSegments(const std::string& text) {
  TcpSegments t;
  std::istringstream lines(text);
  std::vector<std::string> names;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Tcp:", 0) != 0) continue;
    std::istringstream words(line.substr(4));
    std::vector<std::string> fields;
    for (std::string w; words >> w;) fields.push_back(w);
    if (names.empty()) {
      names = std::move(fields);  // the header comes first
      continue;
    }
    for (std::size_t i = 0; i < names.size() && i < fields.size(); ++i) {
      std::int64_t* into = names[i] == "OutSegs" ? &t.out : names[i] == "RetransSegs" ? &t.retrans : nullptr;
      if (into == nullptr) continue;
      try {
        *into = std::stoll(fields[i]);
      } catch (...) {
        *into = -1;
      }
    }
    break;
  }
  return t;
}

double RetransmitPercent(const TcpSegments& before, const TcpSegments& after, std::int64_t min_segments) {
  if (before.out < 0 || before.retrans < 0 || after.out < 0 || after.retrans < 0) return -1;
  const std::int64_t sent = after.out - before.out, again = after.retrans - before.retrans;
  if (sent < std::max<std::int64_t>(min_segments, 1) || again < 0) return -1;
  return 100.0 * static_cast<double>(again) / static_cast<double>(sent);
}

std::set<std::string> InterfacesHolding(const std::string& address) {
  std::set<std::string> out;
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = inet_pton(AF_INET, address.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && inet_pton(AF_INET6, address.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_name == nullptr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr) {
      out.insert(a->ifa_name);
    }
    if (is_v6 && a->ifa_addr->sa_family == AF_INET6 &&
        std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6, sizeof(v6)) == 0) {
      out.insert(a->ifa_name);
    }
  }
  freeifaddrs(list);
  return out;
}

}  // namespace trainguard
