// Node memory copies between agents (docs/restart.md): every agent serves
// its MemoryStore to the others over plain TCP (MemoryCopyMessage framing,
// docs/protocol.md). A node pushes each committed copy of its ranks to the
// next node in group-rank order (PUT); a node that comes back with an empty
// memory fetches its ranks' copies from the node that held them (FETCH).
// Every copy is checked by the restoring rank against the stored commit,
// exactly as one read from storage: the servers only move bytes.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/memory_store.h"
#include "common/clock.h"
#include "trainguard/status.h"

namespace trainguard {

// Serves PUT and FETCH on `address`:0, one connection at a time, each
// operation with a deadline. With a non-empty `job_secret`, a request
// without it is refused (without one, anyone who reaches the port may fetch
// the copies, as they may reach the job's rendezvous store: --secret-file).
// The store must outlive the server.
class MemoryPeerServer {
 public:
  MemoryPeerServer(MemoryStore* store, std::string node_id, std::string job_secret);
  ~MemoryPeerServer();
  MemoryPeerServer(const MemoryPeerServer&) = delete;
  MemoryPeerServer& operator=(const MemoryPeerServer&) = delete;
  Status Start(const std::string& address);
  int port() const { return port_; }
  void Stop();
  // The global ranks [first, first + count) whose copies this node keeps
  // (the previous node's in group-rank order), `keep` steps of each; a PUT
  // of any other rank is refused. None before the first call.
  void Accept(int first, int count, int keep);

 private:
  void Serve(int fd);
  mutable std::mutex accept_mu_;
  int accept_first_ = 0, accept_count_ = 0, accept_keep_ = 1;
  MemoryStore* const store_;
  const std::string node_id_;
  const std::string job_secret_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Pushes the copy `relative` of `store`'s own tree to `peer` (HOST:PORT),
// which keeps the `keep` newest steps of that rank.
Status PushCopy(const std::string& peer, const MemoryStore& store, const std::string& relative, int keep,
                const std::string& job_secret, Nanos timeout);

struct FetchResult {
  int files = 0;
  std::int64_t bytes = 0;
  std::string origin;  // the node the copies came from
};
// Fetches from `peer` the newest copies it holds of `ranks` into `store`'s
// own tree (with their origin). A failure part-way keeps the whole copies
// already fetched.
StatusOr<FetchResult> FetchCopies(const std::string& peer, const std::vector<int>& ranks, MemoryStore* store,
                                  const std::string& job_secret, Nanos timeout);

}  // namespace trainguard
