#include "diag/probes.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

namespace trainguard {

namespace {

Nanos Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ErrnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

// Runs `work` (one unit, returning the units' size: flops, bytes) over and
// over for `budget`, and returns the best rate of any `window`, per ns.
template <typename Work>
double BestWindowRate(Nanos budget, Nanos window, Work work) {
  const Nanos start = Now();
  double best = 0;
  Nanos window_start = start;
  double done = 0;
  for (;;) {
    done += work();
    const Nanos now = Now();
    if (now - window_start >= window) {
      best = std::max(best, done / static_cast<double>(now - window_start));
      window_start = now;
      done = 0;
    }
    if (now - start >= budget) break;
  }
  if (best == 0 && done > 0) best = done / static_cast<double>(Now() - window_start);  // budget < window
  return best;
}

}  // namespace

Figure MeasureCompute(Nanos budget, Nanos window) {
  constexpr int n = 256;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  volatile float sink = 0;
  std::int64_t round = 0;
  const double flops_per_gemm = 2.0 * n * n * n;
  const double per_ns = BestWindowRate(budget, window, [&] {
    std::fill(c.begin(), c.end(), 0.0f);
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < n; ++k) {
        const float aik = a[i * n + k];
        const float* brow = &b[k * n];
        float* crow = &c[i * n];
        for (int j = 0; j < n; ++j) crow[j] += aik * brow[j];
      }
    }
    sink = sink + c[round++ % (n * n)];
    return flops_per_gemm;
  });
  return {"compute_gflops", per_ns, ""};  // flop/ns = GFLOP/s
}

Figure CheckKnownAnswer() {
  constexpr int n = 192;  // |sums| <= 9 * 192 = 1,728: exact in float
  std::mt19937 rng(24);
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<int> ai(n * n), bi(n * n);
  for (auto& x : ai) x = dist(rng);
  for (auto& x : bi) x = dist(rng);
  std::vector<float> a(ai.begin(), ai.end()), b(bi.begin(), bi.end()), c(n * n, 0.0f);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      const float aik = a[i * n + k];
      for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
    }
  }
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      std::int64_t want = 0;
      for (int k = 0; k < n; ++k) want += static_cast<std::int64_t>(ai[i * n + k]) * bi[k * n + j];
      wrong += static_cast<std::int64_t>(c[i * n + j]) != want || c[i * n + j] != static_cast<float>(want);
    }
  }
  return {"gemm_known_answer_mismatches", static_cast<double>(wrong), ""};
}

Figure MeasureMemory(Nanos budget, Nanos window) {
  constexpr std::size_t bytes = 64u << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::int64_t copies = 0;
  const double per_ns = BestWindowRate(budget, window, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    src[copies % bytes] = static_cast<char>(copies);  // keep the copy from being elided
    ++copies;
    return 2.0 * static_cast<double>(bytes);
  });
  return {"memory_gbps", per_ns, ""};  // bytes/ns = GB/s
}

std::vector<Figure> MeasureDisk(const std::string& role, const std::string& dir, std::int64_t bytes) {
  Figure write{"disk_write_mbps:" + role, 0, ""};
  Figure read{"disk_read_mbps:" + role, 0, ""};
  Figure free_space{"disk_free_gib:" + role, 0, ""};
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) {
    free_space.error = ErrnoText("statvfs " + dir);
  } else {
    free_space.value = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize) / (1024.0 * 1024 * 1024);
  }
  const std::string path = dir + "/.trainguard-diag-" + std::to_string(getpid());
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    write.error = read.error = ErrnoText("create " + path);
    return {write, read, free_space};
  }
  std::vector<char> block(1 << 20, 'x');
  const Nanos start = Now();
  std::int64_t written = 0;
  while (written < bytes && write.error.empty()) {
    ssize_t n = ::write(fd, block.data(), block.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      write.error = ErrnoText("write " + path);
    } else {
      written += n;
    }
  }
  if (write.error.empty() && fsync(fd) != 0) write.error = ErrnoText("fsync " + path);
  const Nanos wrote_in = Now() - start;
  close(fd);
  if (write.error.empty()) {
    write.value = static_cast<double>(written) / (1024.0 * 1024) / (static_cast<double>(wrote_in) / kSecond);
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      read.error = ErrnoText("open " + path);
    } else {
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      const Nanos rstart = Now();
      std::int64_t got = 0;
      for (;;) {
        ssize_t n = ::read(fd, block.data(), block.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          read.error = ErrnoText("read " + path);
          break;
        }
        if (n == 0) break;
        got += n;
      }
      const Nanos read_in = Now() - rstart;
      close(fd);
      if (read.error.empty()) {
        read.value = static_cast<double>(got) / (1024.0 * 1024) / (static_cast<double>(read_in) / kSecond);
      }
    }
  } else {
    read.error = "the write failed";
  }
  unlink(path.c_str());
  return {write, read, free_space};
}

}  // namespace trainguard
