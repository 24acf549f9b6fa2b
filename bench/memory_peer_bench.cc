// Node memory copies between agents (docs/restart.md): a rank's 2 GiB copy
// pushed to its peer's memory (in the background, after a commit) and
// fetched back by a node that lost its own (on the restart's path), over
// this machine's loopback, beside reading the same file from this
// machine's disk with the page cache dropped, in the same run. Root: each
// store is a tmpfs of its own with huge pages, as the agent makes it, and
// the cache can be dropped.
//
//   sudo build/bench/memory_peer_bench [GiB] [runs]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "agent/memory_peer.h"
#include "agent/memory_store.h"

namespace {

using trainguard::kSecond;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool WriteFile(const std::string& path, std::uint64_t size) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::vector<char> block(4 << 20);
  for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 131 + (i >> 10));
  bool ok = true;
  for (std::uint64_t done = 0; ok && done < size; done += block.size()) {
    ok = write(fd, block.data(), std::min<std::uint64_t>(block.size(), size - done)) > 0;
  }
  ok = fsync(fd) == 0 && ok;
  return close(fd) == 0 && ok;
}

double ReadFileCold(const std::string& path) {
  sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("1\n", f);
    std::fclose(f);
  }
  double t0 = Now();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<char> block(4 << 20);
  while (read(fd, block.data(), block.size()) > 0) {
  }
  close(fd);
  return Now() - t0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int runs = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::uint64_t size = static_cast<std::uint64_t>(gib * (1ull << 30));
  if (geteuid() != 0) {
    std::fprintf(stderr, "needs root: stores of their own, and dropping the page cache\n");
    return 2;
  }
  const std::string tmp = std::filesystem::temp_directory_path() / ("tg-memory-peer-bench-" + std::to_string(getpid()));
  trainguard::MemoryStore sender(tmp), holder(tmp), replacement(tmp);
  if (!sender.Open("s").ok() || !holder.Open("h").ok()) return 1;
  const std::string rel = "step-000000000100/save-bench-1/rank-00002.data";
  const std::string disk_file = tmp + "/disk/rank-00002.data";
  if (!WriteFile(sender.Root() + "/" + rel, size) || !WriteFile(disk_file, size)) {
    std::fprintf(stderr, "cannot write %llu bytes\n", static_cast<unsigned long long>(size));
    return 1;
  }
  trainguard::MemoryPeerServer server(&holder, "holder", "");
  if (!server.Start("127.0.0.1").ok()) return 1;
  server.Accept(2, 1, 1);
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  std::vector<double> push, fetch, disk;
  for (int r = 0; r < runs; ++r) {
    double t0 = Now();
    trainguard::Status s = trainguard::PushCopy(peer, sender, rel, 1, "", 10 * kSecond);
    push.push_back(Now() - t0);
    trainguard::MemoryStore fresh(tmp);  // a node back with an empty memory
    if (!s.ok() || !fresh.Open("r" + std::to_string(r)).ok()) {
      std::fprintf(stderr, "push: %s\n", s.ToString().c_str());
      return 1;
    }
    t0 = Now();
    auto f = trainguard::FetchCopies(peer, {2}, &fresh, "", 10 * kSecond);
    fetch.push_back(Now() - t0);
    if (!f.ok() || f->bytes != static_cast<std::int64_t>(size)) {
      std::fprintf(stderr, "fetch: %s\n", f.ok() ? "short" : f.status().ToString().c_str());
      return 1;
    }
    disk.push_back(ReadFileCold(disk_file));
  }
  std::printf("a %.2f GiB copy over loopback (stores: %s), median of %d:\n", gib, sender.Describe().c_str(), runs);
  std::printf("  push to the peer (after a commit)        %7.3f s  %6.2f GiB/s\n", Median(push), gib / Median(push));
  std::printf("  fetch by a node back empty (restart)     %7.3f s  %6.2f GiB/s\n", Median(fetch), gib / Median(fetch));
  std::printf("  baseline: the file read from disk, cold  %7.3f s  %6.2f GiB/s\n", Median(disk), gib / Median(disk));
  std::filesystem::remove_all(tmp);
  return 0;
}
