#include "cli/netns_fabric.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

namespace trainguard {

namespace {

// Runs a tool to its end; its stderr is the error's text.
Status Run(const std::vector<std::string>& argv) {
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) return IoError("pipe: " + std::string(std::strerror(errno)));
  pid_t pid = fork();
  if (pid < 0) return IoError("fork: " + std::string(std::strerror(errno)));
  if (pid == 0) {
    dup2(err[1], 2);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(err[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = read(err[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  close(err[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  std::string line;
  for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return IoError("`" + line + "` failed" + (text.empty() ? "" : ": " + text));
}

std::string ShortTag(const std::string& job_id) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%06zx", std::hash<std::string>{}(job_id) & 0xffffff);
  return buf;
}

// /24 subnets already on an interface of this namespace ("10.A.B").
std::set<std::string> SubnetsInUse() {
  std::set<std::string> out;
  FILE* f = popen("ip -o -4 addr show 2>/dev/null", "r");
  if (f == nullptr) return out;
  char line[512];
  while (fgets(line, sizeof(line), f) != nullptr) {
    std::string l(line);
    auto inet = l.find(" inet ");
    if (inet == std::string::npos) continue;
    std::string addr = l.substr(inet + 6, l.find('/', inet) - inet - 6);
    out.insert(addr.substr(0, addr.rfind('.')));
  }
  pclose(f);
  return out;
}

// Deletes this machine's links whose names start with `prefix` (what a
// killed run left: rack bridges, uplinks).
void DeleteLinksNamed(const std::string& prefix) {
  FILE* f = popen("ip -o link show 2>/dev/null", "r");
  if (f == nullptr) return;
  std::vector<std::string> names;
  char line[1024];
  while (fgets(line, sizeof(line), f) != nullptr) {
    std::string l(line);
    auto colon = l.find(": ");
    if (colon == std::string::npos) continue;
    std::string name = l.substr(colon + 2, l.find_first_of(":@", colon + 2) - colon - 2);
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  pclose(f);
  for (const auto& n : names) (void)Run({"ip", "link", "del", n});
}

std::string RackBridge(const std::string& tag, int index) { return "tgk" + tag + std::to_string(index); }
std::string UplinkSpineEnd(const std::string& tag, int index) { return "tgu" + tag + std::to_string(index); }
std::string UplinkRackEnd(const std::string& tag, int index) { return "tgd" + tag + std::to_string(index); }

}  // namespace

NetnsFabric::NetnsFabric(const std::string& job_id) : tag_(ShortTag(job_id)), bridge_("tgb" + tag_) {}

NetnsFabric::~NetnsFabric() { Teardown(); }

std::string NetnsFabric::Unavailable() {
  if (geteuid() != 0) return "--netns needs root (network namespaces, veth pairs and a bridge)";
  if (!std::filesystem::exists("/proc/self/ns/net")) return "--netns: this kernel has no network namespaces";
  if (Run({"ip", "-V"}).ok() == false) return "--netns needs iproute2's `ip` (apt-get install iproute2)";
  return "";
}

Status NetnsFabric::Create() {
  std::lock_guard<std::mutex> lock(mu_);
  // What a killed run of the same job left behind goes first.
  (void)Run({"ip", "link", "del", bridge_});
  for (const char* kind : {"tgu", "tgk"}) DeleteLinksNamed(kind + tag_);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("tg-" + tag_ + "-", 0) == 0) (void)Run({"ip", "netns", "del", name});
  }
  std::set<std::string> used = SubnetsInUse();
  std::size_t h = std::hash<std::string>{}(tag_);
  for (int i = 0; i < 64 && subnet_.empty(); ++i, h = h * 31 + 7) {
    std::string candidate = "10." + std::to_string(200 + h % 50) + "." + std::to_string((h >> 8) % 250);
    if (!used.count(candidate)) subnet_ = candidate;
  }
  if (subnet_.empty()) return IoError("--netns: no free 10.200-249.x.0/24 subnet on this machine");
  gateway_ = subnet_ + ".254";
  created_ = true;
  // A bridge takes the lowest MAC of its ports unless it has one of its own:
  // a port going down would change the gateway's MAC under the other nodes'
  // ARP caches and cut them off for seconds. A fixed, locally administered one.
  const std::string mac = "02:74:67:" + tag_.substr(0, 2) + ":" + tag_.substr(2, 2) + ":" + tag_.substr(4, 2);
  TG_RETURN_IF_ERROR(Run({"ip", "link", "add", bridge_, "address", mac, "type", "bridge"}));
  TG_RETURN_IF_ERROR(Run({"ip", "addr", "add", gateway_ + "/24", "dev", bridge_}));
  return Run({"ip", "link", "set", bridge_, "up"});
}

StatusOr<NodeHost> NetnsFabric::AddNode(const std::string& node_id, const std::string& rack) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!created_) return FailedPrecondition("--netns: the fabric was not created");
  std::string switch_bridge = bridge_;
  if (!rack.empty()) {
    auto r = racks_.find(rack);
    if (r == racks_.end()) {
      if (racks_.size() >= 100) return FailedPrecondition("--netns: at most 100 racks per job");
      const int index = static_cast<int>(racks_.size());
      const std::string tor = RackBridge(tag_, index);
      const std::string up = UplinkSpineEnd(tag_, index);
      const std::string down = UplinkRackEnd(tag_, index);
      // Recorded first: Teardown removes whatever part of it was made.
      r = racks_.emplace(rack, index).first;
      // A MAC of its own, as the spine's (a bridge that takes its lowest
      // port's changes it under its neighbours as ports come and go).
      char mac[32];
      std::snprintf(mac, sizeof(mac), "02:75:%s:%s:%s:%02x", tag_.substr(0, 2).c_str(), tag_.substr(2, 2).c_str(),
                    tag_.substr(4, 2).c_str(), index + 1);
      TG_RETURN_IF_ERROR(Run({"ip", "link", "add", tor, "address", mac, "type", "bridge"}));
      TG_RETURN_IF_ERROR(Run({"ip", "link", "add", up, "type", "veth", "peer", "name", down}));
      TG_RETURN_IF_ERROR(Run({"ip", "link", "set", up, "master", bridge_}));
      TG_RETURN_IF_ERROR(Run({"ip", "link", "set", down, "master", tor}));
      for (const auto& dev : {tor, up, down}) TG_RETURN_IF_ERROR(Run({"ip", "link", "set", dev, "up"}));
    }
    switch_bridge = RackBridge(tag_, r->second);
  }
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    if (next_host_ > 250) return FailedPrecondition("--netns: at most 250 nodes per job");
    int host = next_host_++;
    Node n{"tg-" + tag_ + "-" + node_id, "tgv" + tag_ + std::to_string(host), subnet_ + "." + std::to_string(host)};
    const std::string peer = "tgp" + tag_ + std::to_string(host);
    (void)Run({"ip", "netns", "del", n.ns});
    TG_RETURN_IF_ERROR(Run({"ip", "netns", "add", n.ns}));
    TG_RETURN_IF_ERROR(Run({"ip", "link", "add", n.host_if, "type", "veth", "peer", "name", peer}));
    TG_RETURN_IF_ERROR(Run({"ip", "link", "set", peer, "netns", n.ns}));
    TG_RETURN_IF_ERROR(Run({"ip", "-n", n.ns, "link", "set", peer, "name", "tg0"}));
    TG_RETURN_IF_ERROR(Run({"ip", "-n", n.ns, "addr", "add", n.address + "/24", "dev", "tg0"}));
    TG_RETURN_IF_ERROR(Run({"ip", "-n", n.ns, "link", "set", "tg0", "up"}));
    TG_RETURN_IF_ERROR(Run({"ip", "-n", n.ns, "link", "set", "lo", "up"}));
    TG_RETURN_IF_ERROR(Run({"ip", "link", "set", n.host_if, "master", switch_bridge}));
    TG_RETURN_IF_ERROR(Run({"ip", "link", "set", n.host_if, "up"}));
    it = nodes_.emplace(node_id, n).first;
  }
  NodeHost out;
  out.prefix = {"ip", "netns", "exec", it->second.ns};
  out.address = it->second.address;
  // gloo and NCCL pick the interface by name; the node has one besides lo.
  out.env = {{"GLOO_SOCKET_IFNAME", "tg0"}, {"NCCL_SOCKET_IFNAME", "tg0"}};
  return out;
}

std::string NetnsFabric::NamespaceOf(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? "" : it->second.ns;
}

std::string NetnsFabric::HostInterfaceOf(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? "" : it->second.host_if;
}

std::string NetnsFabric::UplinkOf(const std::string& rack) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = racks_.find(rack);
  return it == racks_.end() ? "" : UplinkSpineEnd(tag_, it->second);
}

void NetnsFabric::Teardown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!created_) return;
  for (const auto& [id, n] : nodes_) {
    (void)Run({"ip", "netns", "del", n.ns});  // takes its end of the veth pair, and so the pair
    (void)Run({"ip", "link", "del", n.host_if});  // in case the namespace could not go
  }
  nodes_.clear();
  for (const auto& [name, index] : racks_) {
    (void)Run({"ip", "link", "del", UplinkSpineEnd(tag_, index)});  // and its other end
    (void)Run({"ip", "link", "del", RackBridge(tag_, index)});
  }
  racks_.clear();
  (void)Run({"ip", "link", "del", bridge_});
  created_ = false;
}

}  // namespace trainguard
