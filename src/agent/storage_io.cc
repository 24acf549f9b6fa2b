#include "agent/storage_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <set>
#include <sstream>

#include "common/small_file.h"

namespace trainguard {
namespace {

std::string ReadLink(const std::string& path) {
  char buf[4096];
  ssize_t n = readlink(path.c_str(), buf, sizeof(buf) - 1);
  return n <= 0 ? "" : std::string(buf, static_cast<std::size_t>(n));
}

// Whether /proc/PID/fd/N is a regular file (or, with `dirs`, a directory),
// from the attributes the kernel has cached: AT_STATX_DONT_SYNC asks no
// file server (a plain stat of a file on a hung NFS or FUSE mount would
// block the agent's heartbeat in the server's getattr).
bool IsFileOrDir(const std::string& fd_link, bool dirs) {
  struct statx stx {};
  if (statx(AT_FDCWD, fd_link.c_str(), AT_STATX_DONT_SYNC, STATX_TYPE, &stx) != 0) return false;
  return S_ISREG(stx.stx_mode) || (dirs && S_ISDIR(stx.stx_mode));
}

// Paths of pseudo file systems: never a storage stall.
bool PseudoPath(const std::string& path) {
  for (const char* p : {"/dev/", "/proc/", "/sys/", "/run/", "/dev/shm/"}) {
    if (path.rfind(p, 0) == 0) return true;
  }
  return false;
}

// The state letter of /proc/.../stat ("" if unreadable).
std::string StateOf(const std::string& stat_path) {
  std::string line = ReadSmallFile(stat_path);
  std::size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? "" : line.substr(close + 2, 1);
}

}  // namespace

std::vector<BlockedTask> FindBlockedTasks(const std::vector<pid_t>& pids, bool scan_tasks,
                                          const std::string& proc_root) {
  std::vector<BlockedTask> blocked;
  for (pid_t pid : pids) {
    const std::string base = proc_root + "/" + std::to_string(pid);
    std::vector<pid_t> tids;
    if (scan_tasks) {
      if (DIR* d = opendir((base + "/task").c_str())) {
        while (dirent* e = readdir(d)) {
          if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.push_back(static_cast<pid_t>(std::atol(e->d_name)));
        }
        closedir(d);
      }
    } else {
      tids.push_back(pid);
    }
    std::vector<MountEntry> mounts;
    bool mounts_read = false;
    for (pid_t tid : tids) {
      const std::string task = base + "/task/" + std::to_string(tid);
      // D: waiting in the kernel. S too, for a call on a regular file: FUSE
      // (direct I/O) and some network file systems wait interruptibly, and
      // nothing else keeps a read of a regular file waiting.
      const std::string state = StateOf(task + "/stat");
      if (state != "D" && state != "S") continue;
      // "0 0x3 0x3ff00de0 0x1000 ..." (number, then six arguments, sp, pc);
      // "-1 sp pc" outside a system call (a page fault); "running" if not blocked.
      std::istringstream sc(ReadSmallFile(task + "/syscall"));
      std::string number;
      if (!(sc >> number) || number == "running") continue;
      BlockedTask t;
      t.pid = pid;
      t.tid = tid;
      long nr = std::strtol(number.c_str(), nullptr, 10);
      if (nr < 0) {
        if (state != "D") continue;
        t.call = "page fault";
      } else {
        FileCall call = FileCallOf(nr);
        if (call.name.empty()) continue;  // blocked, but not on a file
        t.call = call.name;
        std::vector<std::string> args;
        std::string a;
        while (args.size() < 6 && sc >> a) args.push_back(a);
        if (call.fd_arg >= 0 && call.fd_arg < static_cast<int>(args.size())) {
          long fd = std::strtol(args[call.fd_arg].c_str(), nullptr, 16);
          const std::string link = base + "/fd/" + std::to_string(fd);
          std::string target = ReadLink(link);
          // Regular files and directories only: a pipe, socket, FIFO or
          // device waits for its peer, not for storage.
          if (target.empty() || target[0] != '/' || !IsFileOrDir(link, true)) continue;
          t.path = target;
        } else if (state != "D") {
          continue;  // given a path, waiting interruptibly: a FIFO's open, say
        }
      }
      if (!t.path.empty()) {
        if (!mounts_read) {
          mounts = ParseMountinfo(ReadSmallFile(base + "/mountinfo"));
          mounts_read = true;
        }
        t.mount = MountOf(t.path, mounts);
      }
      blocked.push_back(t);
    }
  }
  return blocked;
}

std::vector<BlockedTracker::Blocked> BlockedTracker::Update(const std::vector<BlockedTask>& now, Nanos now_mono) {
  std::map<std::string, Nanos> seen;
  std::vector<Blocked> out;
  for (const BlockedTask& t : now) {
    auto it = first_seen_.find(t.key());
    Nanos since = it == first_seen_.end() ? now_mono : it->second;
    seen[t.key()] = since;
    out.push_back({t, since});
  }
  first_seen_ = std::move(seen);
  return out;
}

std::vector<OpenFile> OpenDataFiles(const std::vector<pid_t>& pids, const std::set<std::string>& ignore,
                                    std::size_t max_mounts, const std::string& proc_root) {
  std::vector<OpenFile> out;
  std::set<std::string> seen;  // mount points
  std::vector<MountEntry> mounts;
  bool mounts_read = false;
  for (pid_t pid : pids) {
    const std::string base = proc_root + "/" + std::to_string(pid);
    DIR* d = opendir((base + "/fd").c_str());
    if (d == nullptr) continue;
    while (dirent* e = readdir(d)) {
      if (out.size() >= max_mounts) break;
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const std::string link = base + "/fd/" + e->d_name;
      std::string target = ReadLink(link);
      // Sockets, pipes and anonymous inodes read "socket:[N]" and the like.
      if (target.empty() || target[0] != '/' || PseudoPath(target) || ignore.count(target) ||
          !IsFileOrDir(link, false)) {
        continue;
      }
      if (!mounts_read) {
        mounts = ParseMountinfo(ReadSmallFile(base + "/mountinfo"));
        mounts_read = true;
      }
      OpenFile f{target, MountOf(target, mounts)};
      if (f.mount.fstype == "tmpfs" || f.mount.fstype == "devtmpfs") continue;  // memory, not storage
      if (seen.insert(f.mount.mount_point).second) out.push_back(std::move(f));
    }
    closedir(d);
    if (out.size() >= max_mounts) break;
  }
  return out;
}

}  // namespace trainguard
