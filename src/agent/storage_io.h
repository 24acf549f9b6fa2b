// Storage I/O of a rank's processes, read from /proc without the script's
// help: what each process read and wrote (/proc/PID/io), and which of its
// tasks wait in the kernel (state D) inside a file system call, on which
// file and mount (/proc/PID/task/TID/syscall, /proc/PID/fd, mountinfo). A
// rank stalled reading its data from a slow or hung file system is then a
// storage stall naming the mount, not a hang of its collectives.
//
// Reading /proc/PID/task/TID/syscall needs the rights of a tracer (the
// agent is the ranks' parent, or root). A path a call got as an argument
// (openat, stat) lives in the process's memory, which is not read (a
// process stuck in a page fault can block a reader of its memory): only
// calls on a file descriptor name their file.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agent/file_calls.h"
#include "common/clock.h"
#include "common/mounts.h"

namespace trainguard {

struct BlockedTask {
  pid_t pid = 0;
  pid_t tid = 0;
  std::string call;   // "read", "openat", ...; "page fault" (no system call)
  std::string path;   // the file, "" if unknown
  MountEntry mount;
  std::string key() const { return std::to_string(tid) + " " + call + " " + path; }
};
// The tasks of `pids` in state D in a file system call or a page fault.
// `scan_tasks`: every thread, else only each process's main thread (cheap).
std::vector<BlockedTask> FindBlockedTasks(const std::vector<pid_t>& pids, bool scan_tasks,
                                          const std::string& proc_root = "/proc");

// A regular file a rank's processes hold open, with its mount: where its
// data comes from (one per mount, the first file found on it).
struct OpenFile {
  std::string path;
  MountEntry mount;
};
// The regular files `pids` hold open, one per mount, at most `max_mounts`;
// pseudo and memory file systems (/dev, /proc, /sys, tmpfs) and the files
// in `ignore` (trainguard's own: the stacks file a rank holds open) left out.
std::vector<OpenFile> OpenDataFiles(const std::vector<pid_t>& pids, const std::set<std::string>& ignore = {},
                                    std::size_t max_mounts = 4, const std::string& proc_root = "/proc");

// How long each blocked task has been blocked in the same call on the same
// file, from successive samples (a task seen in another call starts over).
class BlockedTracker {
 public:
  struct Blocked {
    BlockedTask task;
    Nanos since = 0;
  };
  // The tasks blocked now, each with when it was first seen so.
  std::vector<Blocked> Update(const std::vector<BlockedTask>& now, Nanos now_mono);

 private:
  std::map<std::string, Nanos> first_seen_;
};

}  // namespace trainguard
