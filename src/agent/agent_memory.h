// Agent internals: the state of node memory copies (agent_memory.cc).
#pragma once

#include <sys/stat.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "agent/agent.h"
#include "agent/memory_peer.h"
#include "agent/memory_store.h"

namespace trainguard {

constexpr Nanos kMemoryCopyTimeout = 10 * kSecond;  // no progress for this long fails a push or a fetch

struct Agent::MemoryCopies {
  explicit MemoryCopies(const AgentConfig& config)
      : store(config.shm_dir), server(&store, config.node_id, config.job_secret), secret(config.job_secret),
        node_id(config.node_id) {}
  ~MemoryCopies() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (pusher.joinable()) pusher.join();
    server.Stop();
  }
  void Push(const std::string& to, const std::string& relative, int keep_steps) {
    std::lock_guard<std::mutex> lock(mu);
    todo.push_back({to, relative, keep_steps});
    if (!pusher.joinable()) pusher = std::thread([this] { PushLoop(); });
    cv.notify_all();
  }
  void PushLoop() {
    std::string said;
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !todo.empty(); });
        if (stopping) return;
        item = todo.front();
        todo.pop_front();
      }
      struct stat st;
      if (stat((store.Root() + "/" + item.relative).c_str(), &st) != 0) continue;  // a newer commit replaced it
      Status s = PushCopy(item.to, store, item.relative, item.keep, secret, kMemoryCopyTimeout);
      if (!s.ok() && s.message() != said) {  // each new reason once
        said = s.message();
        std::fprintf(stderr, "trainguard agent %s: memory copy %s not kept on its peer: %s\n", node_id.c_str(),
                     item.relative.c_str(), said.c_str());
      }
    }
  }

  MemoryStore store;  // before the server: it outlives it
  MemoryPeerServer server;
  const std::string secret;
  const std::string node_id;
  // Control loop only.
  std::string peer;                          // where this node's copies go ("" = nowhere)
  int keep = 1;
  std::map<int, std::int64_t> pushed_step;   // by global rank: the newest committed step queued
  Nanos next_scan = 0;
  bool said_root = false;
  // The pusher's queue.
  struct Item {
    std::string to, relative;
    int keep = 1;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> todo;
  bool stopping = false;
  std::thread pusher;
};

}  // namespace trainguard
