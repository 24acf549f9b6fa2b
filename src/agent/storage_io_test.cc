// Blocked file I/O from a stand-in /proc tree (the formats of proc(5)); the
// real one is exercised end to end by tests/test_storage.py with FUSE.
#include "agent/storage_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace trainguard {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMountinfo =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:39 / /mnt/data ro,nosuid,nodev,relatime shared:7 - fuse.sshfs host:/data ro,user_id=0\n"
    "41 22 0:40 / /mnt/my\\040disk rw,relatime - xfs /dev/nvme0n1 rw\n"
    "42 40 0:41 / /mnt/data/cache rw - tmpfs tmpfs rw\n";

TEST(StorageIoTest, MountsAreParsedAndTheLongestPrefixHoldsAPath) {
  auto mounts = ParseMountinfo(kMountinfo);
  ASSERT_EQ(mounts.size(), 4u);
  EXPECT_EQ(mounts[2].mount_point, "/mnt/my disk");
  EXPECT_EQ(MountOf("/mnt/data/shard-3", mounts).fstype, "fuse.sshfs");
  EXPECT_EQ(MountOf("/mnt/data/cache/x", mounts).fstype, "tmpfs");
  EXPECT_EQ(MountOf("/mnt/database", mounts).mount_point, "/");  // a prefix of the name only
  EXPECT_EQ(MountOf("/mnt/my disk/ckpt", mounts).source, "/dev/nvme0n1");
  EXPECT_TRUE(IsSharedFilesystem("fuse.sshfs"));
  EXPECT_TRUE(IsSharedFilesystem("nfs4"));
  EXPECT_TRUE(IsSharedFilesystem("lustre"));
  EXPECT_FALSE(IsSharedFilesystem("xfs"));
}

class FakeProc {
 public:
  FakeProc() : root_(fs::temp_directory_path() / ("tg-fakeproc-" + std::to_string(getpid()))) {
    fs::remove_all(root_);
  }
  ~FakeProc() { fs::remove_all(root_); }
  // A task of `pid` in `state`, in system call `syscall_line`.
  void Task(int pid, int tid, const std::string& state, const std::string& syscall_line) {
    fs::path t = root_ / std::to_string(pid) / "task" / std::to_string(tid);
    fs::create_directories(t);
    std::ofstream(t / "stat") << tid << " (python3 (x)) " << state << " 1 1 1 0 -1\n";
    std::ofstream(t / "syscall") << syscall_line << "\n";
    std::ofstream(root_ / std::to_string(pid) / "mountinfo") << kMountinfo;
  }
  void Fd(int pid, int fd, const std::string& target) {
    fs::create_directories(root_ / std::to_string(pid) / "fd");
    fs::create_symlink(target, root_ / std::to_string(pid) / "fd" / std::to_string(fd));
  }
  std::string root() const { return root_.string(); }

 private:
  fs::path root_;
};

std::string Call(long nr, const std::string& args) { return std::to_string(nr) + " " + args + " 0x7ffe 0x7f00"; }

TEST(StorageIoTest, ATaskInDInsideAReadOfAFileNamesTheFileAndItsMount) {
  FakeProc proc;
  proc.Task(100, 100, "D", Call(SYS_read, "0x3 0x7f0000 0x1000 0x0 0x0 0x0"));
  proc.Task(100, 101, "S", Call(SYS_futex, "0x7f00 0x80 0x0 0x0 0x0 0x0"));  // waiting on a lock: not storage
  proc.Task(100, 102, "D", Call(SYS_read, "0x4 0x7f0000 0x1000 0x0 0x0 0x0"));  // a pipe: not storage
  proc.Task(100, 103, "D", Call(SYS_openat, "0xffffff9c 0x7f0000 0x0 0x0 0x0 0x0"));
  proc.Task(100, 104, "D", "-1 0x7ffe 0x7f00");
  proc.Task(100, 105, "D", Call(SYS_ioctl, "0x5 0x0 0x0 0x0 0x0 0x0"));  // a driver: not a file call
  proc.Task(100, 106, "S", Call(SYS_read, "0x5 0x7f0000 0x1000 0x0 0x0 0x0"));  // FUSE waits interruptibly
  proc.Task(100, 107, "S", Call(SYS_openat, "0xffffff9c 0x7f0000 0x0 0x0 0x0 0x0"));  // a FIFO's open, say
  proc.Task(100, 108, "S", Call(SYS_read, "0x6 0x7f0000 0x1000 0x0 0x0 0x0"));  // a FIFO: waits for its writer
  // Python's os.preadv and O_DIRECT readers call preadv2 (and pwritev2).
  proc.Task(100, 109, "D", Call(SYS_preadv2, "0x3 0x7f0000 0x1 0x0 0x0 0x0"));
  proc.Task(100, 110, "D", Call(SYS_pwritev2, "0x5 0x7f0000 0x1 0x0 0x0 0x0"));
  // The files the descriptors point at (the stand-in's are real files here).
  std::ofstream(proc.root() + "/shard-3") << "x";
  std::ofstream(proc.root() + "/shard-5") << "x";
  mkfifo((proc.root() + "/fifo").c_str(), 0600);
  proc.Fd(100, 3, proc.root() + "/shard-3");
  proc.Fd(100, 4, "pipe:[4472133]");
  proc.Fd(100, 5, proc.root() + "/shard-5");
  proc.Fd(100, 6, proc.root() + "/fifo");
  auto main_only = FindBlockedTasks({100}, false, proc.root());
  ASSERT_EQ(main_only.size(), 1u);
  EXPECT_EQ(main_only[0].call, "read");
  EXPECT_EQ(main_only[0].path, proc.root() + "/shard-3");
  EXPECT_EQ(main_only[0].mount.mount_point, "/");  // the stand-in's mountinfo: under /
  EXPECT_EQ(main_only[0].mount.fstype, "ext4");
  auto all = FindBlockedTasks({100}, true, proc.root());
  std::vector<std::string> calls;
  for (const auto& t : all) calls.push_back(std::to_string(t.tid) + " " + t.call + " " + t.path);
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<std::string>{"100 read " + proc.root() + "/shard-3", "103 openat ",
                                              "104 page fault ", "106 read " + proc.root() + "/shard-5",
                                              "109 preadv2 " + proc.root() + "/shard-3",
                                              "110 pwritev2 " + proc.root() + "/shard-5"}));
}

TEST(FileCallsTest, EveryCallOfTheArchitectureIsClassified) {
  EXPECT_GT(SystemCallCount(), 300);
  std::vector<std::string> left = UnclassifiedSystemCalls();
  std::string names;
  for (const auto& n : left) names += n + " ";
  EXPECT_TRUE(left.empty()) << "classify in src/agent/file_calls.cc: " << names;
}

TEST(FileCallsTest, CallsAreKnownByTheirNumberOnThisArchitecture) {
  EXPECT_EQ(FileCallOf(SYS_preadv2).name, "preadv2");
  EXPECT_EQ(FileCallOf(SYS_preadv2).fd_arg, 0);
  EXPECT_EQ(FileCallOf(SYS_pwritev2).name, "pwritev2");
  EXPECT_EQ(FileCallOf(SYS_sendfile).fd_arg, 1);  // what it reads is its second descriptor
  EXPECT_EQ(FileCallOf(SYS_mmap).fd_arg, 4);
  EXPECT_EQ(FileCallOf(SYS_openat2).name, "openat2");
  EXPECT_EQ(FileCallOf(SYS_openat2).fd_arg, -1);
  EXPECT_EQ(FileCallOf(SYS_sync).fd_arg, -1);
  for (long n : std::initializer_list<long>{SYS_futex, SYS_ioctl, SYS_epoll_wait, SYS_recvfrom, SYS_nanosleep, -1, 100000}) {
    EXPECT_EQ(FileCallOf(n).name, "") << n;
  }
}

TEST(StorageIoTest, TheOpenDataFilesAreOnePerMountWithoutPipesDevicesOrDirectories) {
  FakeProc proc;
  proc.Task(200, 200, "S", Call(SYS_read, "0x4 0x7f0000 0x1000 0x0 0x0 0x0"));
  proc.Task(201, 201, "S", Call(SYS_read, "0x4 0x7f0000 0x1000 0x0 0x0 0x0"));  // a loader worker
  std::ofstream(proc.root() + "/shard-1") << "x";
  std::ofstream(proc.root() + "/shard-2") << "x";
  proc.Fd(200, 3, "socket:[99]");
  proc.Fd(200, 4, "pipe:[4472133]");
  proc.Fd(200, 5, "/dev/null");
  proc.Fd(200, 6, proc.root());  // a directory: not data
  proc.Fd(201, 7, proc.root() + "/shard-1");
  proc.Fd(201, 8, proc.root() + "/shard-2");  // the same mount again
  proc.Fd(201, 9, proc.root() + "/gone");     // deleted since: no attributes, left out
  auto files = OpenDataFiles({200, 201}, {}, 4, proc.root());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(files[0].path == proc.root() + "/shard-1" || files[0].path == proc.root() + "/shard-2")
      << files[0].path;
  EXPECT_EQ(files[0].mount.mount_point, "/");
  EXPECT_EQ(files[0].mount.fstype, "ext4");
  EXPECT_TRUE(OpenDataFiles({200}, {}, 4, proc.root()).empty());
  EXPECT_TRUE(OpenDataFiles({12345}, {}, 4, proc.root()).empty());  // gone
  // trainguard's own files (a rank's stacks file) are not its data.
  EXPECT_TRUE(OpenDataFiles({201}, {proc.root() + "/shard-1", proc.root() + "/shard-2"}, 4, proc.root()).empty());
}

TEST(StorageIoTest, ATaskIsBlockedSinceItWasFirstSeenInTheSameCall) {
  BlockedTracker tracker;
  BlockedTask t;
  t.tid = 7;
  t.call = "read";
  t.path = "/mnt/data/a";
  EXPECT_EQ(tracker.Update({t}, 10 * kSecond)[0].since, 10 * kSecond);
  EXPECT_EQ(tracker.Update({t}, 12 * kSecond)[0].since, 10 * kSecond);
  t.path = "/mnt/data/b";  // another file: another wait
  EXPECT_EQ(tracker.Update({t}, 13 * kSecond)[0].since, 13 * kSecond);
  EXPECT_TRUE(tracker.Update({}, 14 * kSecond).empty());
  EXPECT_EQ(tracker.Update({t}, 15 * kSecond)[0].since, 15 * kSecond);
}

}  // namespace
}  // namespace trainguard
