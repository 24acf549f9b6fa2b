// ParallelFor: runs fn(i) for i in [0, n) on up to `threads` threads that
// take indices in order. Used for copies, writes, reads and checksums of
// checkpoint pieces, where each index is megabytes of work.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace trainguard {

template <typename F>
void ParallelFor(std::size_t n, int threads, F fn) {
  std::size_t workers = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(threads, 1)));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (std::size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  }
  for (auto& t : pool) t.join();
}

}  // namespace trainguard
