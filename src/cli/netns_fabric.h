// NetnsFabric: `run --netns` — every node of a job on this machine in its own
// network namespace, as if it were a host of its own. One bridge (the "rack"
// switch) in the root namespace, a veth pair per node: its end in the node's
// namespace is `tg0` with the node's address, the other end hangs on the
// bridge. The controller listens on the bridge's address; ranks talk over
// the veths, which a test (or an operator) can throttle with tc, flap with
// `ip link set down/up`, or cut. Everything is made with iproute2's `ip` and
// removed again by Teardown (and the destructor), whatever happened.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

// Where a node's agent runs: the command prefix that enters its namespace,
// the address peers reach it at, and the environment its ranks need there.
struct NodeHost {
  std::vector<std::string> prefix;
  std::string address;
  std::map<std::string, std::string> env;
};

class NetnsFabric {
 public:
  // Names derive from `job_id`: the same job id finds (and first removes)
  // what a killed run of it left behind.
  explicit NetnsFabric(const std::string& job_id);
  ~NetnsFabric();

  // Whether this process can make namespaces; "" if so, else why not (one line).
  static std::string Unavailable();

  // Creates the bridge and its subnet. Errors name the command that failed.
  Status Create();
  // The bridge's address: where the controller listens.
  const std::string& gateway() const { return gateway_; }
  // Creates the node's namespace and veth pair (once per node id), plugged
  // into its rack's bridge (a top-of-rack switch, made at its first node and
  // linked to the spine bridge by a veth pair of its own), or, with rack "",
  // into the spine bridge itself.
  StatusOr<NodeHost> AddNode(const std::string& node_id, const std::string& rack = "");
  // The spine-side end of a rack's uplink ("" if the rack has no bridge):
  // what a test throttles or cuts to slow or split a whole rack.
  std::string UplinkOf(const std::string& rack) const;
  // The namespace and the host-side interface of a node ("" if unknown).
  std::string NamespaceOf(const std::string& node_id) const;
  std::string HostInterfaceOf(const std::string& node_id) const;
  // Removes every namespace, veth and bridge. Idempotent.
  void Teardown();

 private:
  struct Node {
    std::string ns;
    std::string host_if;
    std::string address;
  };
  std::string tag_;     // short hash of the job id, for interface names (15 chars at most)
  std::string bridge_;
  std::string subnet_;  // "10.A.B" (a /24)
  std::string gateway_;
  mutable std::mutex mu_;
  std::map<std::string, Node> nodes_;
  std::map<std::string, int> racks_;  // rack name -> index in interface names
  int next_host_ = 1;
  bool created_ = false;
};

}  // namespace trainguard
