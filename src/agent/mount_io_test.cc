// Per-mount counters against proc(5)'s /proc/diskstats, the kernel's NFS
// mountstats format (statvers 1.1), Lustre's llite stats and GPFS's
// `mmpmon -p` fs_io_s (their documented formats, in stand-in files and a
// stand-in program), and this machine's own files.
#include "agent/mount_io.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include "testing/wait_until.h"

namespace trainguard {
namespace {

constexpr const char* kMountinfo =
    "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
    "23 22 254:1 /srv/ckpt /ckpt rw,relatime shared:1 - ext4 /dev/vda1 rw\n"  // a bind mount of the same disk
    "24 22 259:0 / /scratch rw,relatime - xfs /dev/nvme0n1 rw\n"
    "25 22 0:52 / /data rw,relatime - nfs4 filer:/data rw,vers=4.2\n"
    "26 22 0:5 / /dev rw - devtmpfs udev rw\n"
    "27 22 0:60 / /mnt/fuse rw - fuse.sshfs host:/x rw\n";

constexpr const char* kDiskstats =
    " 254       0 vda 100 0 4000 50 200 0 8000 90 0 100 140 0 0 0 0\n"
    " 254       1 vda1 90 0 3600 45 180 0 7000 80 0 90 125 0 0 0 0\n"
    " 259       0 nvme0n1 10 0 2048 5 20 0 4096 9 0 10 14\n";  // an older kernel's 11 fields

constexpr const char* kMountstats =
    "device rootfs mounted on / with fstype rootfs\n"
    "device filer:/data mounted on /data with fstype nfs4 statvers=1.1\n"
    "\topts:\trw,vers=4.2,rsize=1048576\n"
    "\tbytes:\t1000 200 30 4 5000 300 8 2\n"
    "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)\n"
    "\tper-op statistics\n"
    "\t        NULL: 1 1 0 44 24 0 0 0 0\n"
    "\t        READ: 40 40 0 6000 5200 1 20 25 0\n"
    "\t       WRITE: 7 7 0 1200 900 0 5 6 0\n"
    "\t        OPEN: 12 12 0 3000 4000 0 9 10 0\n"
    "\t      LOOKUP: 30 30 0 4000 7000 0 10 12 2\n"
    "\t     GETATTR: 50 50 0 5000 8000 0 11 13 0\n"
    "device tmpfs mounted on /run with fstype tmpfs\n";

TEST(MountIoTest, BlockMountsFromDiskstatsAndNfsFromMountstats) {
  auto io = MountIoOf(ParseMountinfo(kMountinfo), ParseDiskstats(kDiskstats), ParseNfsMountstats(kMountstats));
  ASSERT_EQ(io.size(), 3u);  // /, /scratch, /data; the bind mount, /dev and FUSE are not counted
  EXPECT_EQ(io[0].mount.mount_point, "/");
  EXPECT_EQ(io[0].read_bytes, 3600 * 512);
  EXPECT_EQ(io[0].write_bytes, 7000 * 512);
  EXPECT_EQ(io[0].reads, 90);
  EXPECT_EQ(io[0].writes, 180);
  EXPECT_EQ(io[0].metadata_ops, -1);
  EXPECT_EQ(io[1].mount.mount_point, "/scratch");
  EXPECT_EQ(io[1].write_bytes, 4096 * 512);
  EXPECT_EQ(io[2].mount.mount_point, "/data");
  EXPECT_EQ(io[2].mount.fstype, "nfs4");
  EXPECT_EQ(io[2].mount.source, "filer:/data");
  EXPECT_EQ(io[2].read_bytes, 1000 + 30);  // through the page cache and direct
  EXPECT_EQ(io[2].write_bytes, 200 + 4);
  EXPECT_EQ(io[2].reads, 40);
  EXPECT_EQ(io[2].writes, 7);
  EXPECT_EQ(io[2].metadata_ops, 12 + 30 + 50);
}

TEST(MountIoTest, MalformedLinesAreSkippedAndThisMachinesFilesParse) {
  EXPECT_TRUE(ParseDiskstats("8 0 sda 1 2\ngarbage\n").empty());
  EXPECT_TRUE(ParseNfsMountstats("\tbytes:\t1 2 3 4\ndevice x mounted on /y with fstype nfs\n\tREAD: oops\n")
                  .at("/y").reads == 0);
  for (const MountIo& m : SampleMountIo()) {  // whatever this machine has: well formed
    EXPECT_FALSE(m.mount.mount_point.empty());
    EXPECT_GE(m.read_bytes, 0);
    EXPECT_GE(m.write_bytes, 0);
  }
}

constexpr const char* kLustreStats =
    "snapshot_time             1700000000.123456789 secs.nsecs\n"
    "read_bytes                500 samples [bytes] 4096 1048576 209715200 1\n"
    "write_bytes               20 samples [bytes] 4096 4096 81920 1\n"
    "ioctl                     3 samples [regs]\n"
    "open                      40 samples [usecs] 10 90 1000 30000\n"
    "close                     38 samples [usecs] 1 9 100 300\n"
    "getattr                   100 samples [usecs] 1 5 200 500\n"
    "seek                      9 samples [usecs] 1 1 9 9\n"
    "readdir                   2 samples [regs]\n";

TEST(MountIoTest, LustreLliteStats) {
  MountIo io = ParseLustreStats(kLustreStats);
  EXPECT_EQ(io.reads, 500);
  EXPECT_EQ(io.read_bytes, 209715200);
  EXPECT_EQ(io.writes, 20);
  EXPECT_EQ(io.write_bytes, 81920);
  EXPECT_EQ(io.metadata_ops, 40 + 38 + 100 + 2);  // not ioctl, not seek
  EXPECT_EQ(ParseLustreStats("read_bytes oops samples\nopen 5 sample\n").metadata_ops, 0);
  EXPECT_EQ(LustreFsName("10.0.0.1@o2ib:10.0.0.2@o2ib:/scratch"), "scratch");
  EXPECT_EQ(LustreFsName("mgs@tcp:/home/alice"), "home");  // a subdirectory mount
  EXPECT_EQ(LustreFsName("/dev/sda1"), "");
}

TEST(MountIoTest, GpfsMmpmonFsIo) {
  auto fs = ParseMmpmonFsIo(
      "_fs_io_s_ _n_ 10.0.0.8 _nn_ node1 _rc_ 0 _t_ 1066660148 _tu_ 407431 _cl_ c1.example _fs_ gpfs2 _d_ 2 "
      "_br_ 6291456 _bw_ 314572800 _oc_ 10 _cc_ 16 _rdc_ 101 _wc_ 300 _dir_ 7 _iu_ 2\n"
      "_fs_io_s_ _n_ 10.0.0.8 _nn_ node1 _rc_ 1 _t_ 1066660148 _tu_ 407431 _cl_ c1 _fs_ broken _d_ 2\n"
      "_fs_io_s_ _n_ 10.0.0.8 _nn_ node1 _rc_ 0 _cl_ c1 _fs_ torn _br_ 12x _bw_ 1\n"
      "_io_s_ _n_ 10.0.0.8 _nn_ node1 _rc_ 0 _br_ 1\n");
  ASSERT_EQ(fs.size(), 1u);
  const MountIo& io = fs.at("gpfs:gpfs2");
  EXPECT_EQ(io.read_bytes, 6291456);
  EXPECT_EQ(io.write_bytes, 314572800);
  EXPECT_EQ(io.reads, 101);
  EXPECT_EQ(io.writes, 300);
  EXPECT_EQ(io.metadata_ops, 10 + 16 + 7 + 2);
}

TEST(MountIoTest, ParallelFileSystemsCountOncePerFileSystem) {
  const char* mountinfo =
      "22 1 254:1 / / rw - ext4 /dev/vda1 rw\n"
      "30 22 0:70 / /lustre/scratch rw - lustre 10.0.0.1@o2ib:/scratch rw,flock\n"
      "31 22 0:71 / /home rw - lustre 10.0.0.1@o2ib:/scratch/home rw\n"  // the same file system again
      "32 22 0:72 / /gpfs/fs1 rw - gpfs fs1 rw\n"
      "33 22 0:73 / /lustre/other rw - lustre 10.0.0.1@o2ib:/other rw\n";  // no counters for it
  std::map<std::string, MountIo> parallel = {{"lustre:scratch", ParseLustreStats(kLustreStats)}};
  parallel["gpfs:fs1"].read_bytes = 77;
  auto io = MountIoOf(ParseMountinfo(mountinfo), ParseDiskstats(" 254 1 vda1 1 0 2 0 3 0 4 0 0 0 0\n"), {}, parallel);
  ASSERT_EQ(io.size(), 3u);
  EXPECT_EQ(io[1].mount.mount_point, "/lustre/scratch");
  EXPECT_EQ(io[1].reads, 500);
  EXPECT_EQ(io[2].mount.mount_point, "/gpfs/fs1");
  EXPECT_EQ(io[2].read_bytes, 77);
}

std::string TempDir() {
  char dir[] = "/tmp/tg-mount-io-XXXXXX";
  return mkdtemp(dir) ? dir : "";
}

void Write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(MountIoTest, LustreInstancesUnderProcAndDebugfsAreSummedPerFileSystem) {
  const std::filesystem::path root = TempDir();
  Write(root / "proc/self/mountinfo", "30 22 0:70 / /lustre/scratch rw - lustre mgs@tcp:/scratch rw\n");
  Write(root / "proc/fs/lustre/llite/scratch-ffff8881a2b3c000/stats", kLustreStats);
  Write(root / "sys/kernel/debug/lustre/llite/scratch-ffff8881a2b3d000/stats", kLustreStats);
  Write(root / "sys/kernel/debug/lustre/llite/nodash/stats", kLustreStats);
  auto io = SampleMountIo((root / "proc").string(), (root / "sys").string());
  std::filesystem::remove_all(root);
  ASSERT_EQ(io.size(), 1u);
  EXPECT_EQ(io[0].mount.mount_point, "/lustre/scratch");
  EXPECT_EQ(io[0].reads, 2 * 500);
  EXPECT_EQ(io[0].read_bytes, 2 * 209715200LL);
  EXPECT_EQ(io[0].metadata_ops, 2 * 180);
}

TEST(MountIoTest, GpfsSamplerRunsMmpmonOffTheCallersThread) {
  const std::filesystem::path root = TempDir();
  // A stand-in mmpmon: answers fs_io_s on standard input as `mmpmon -p` does.
  Write(root / "mmpmon",
        "#!/bin/sh\n"
        "[ \"$1 $2\" = \"-p -s\" ] || exit 2\n"
        "read request; [ \"$request\" = fs_io_s ] || exit 3\n"
        "echo '_fs_io_s_ _n_ 10.0.0.8 _nn_ n1 _rc_ 0 _t_ 1 _tu_ 2 _cl_ c _fs_ fs1 _d_ 1 _br_ 5 _bw_ 6 _oc_ 1 _cc_ 1 "
        "_rdc_ 2 _wc_ 3 _dir_ 0 _iu_ 0'\n");
  chmod((root / "mmpmon").c_str(), 0755);
  {
    GpfsSampler sampler((root / "mmpmon").string(), 50 * kMillisecond);
    std::map<std::string, MountIo> latest;
    testutil::WaitUntil([&] { return !(latest = sampler.Latest()).empty(); }, std::chrono::seconds(10));
    ASSERT_EQ(latest.count("gpfs:fs1"), 1u);
    EXPECT_EQ(latest["gpfs:fs1"].read_bytes, 5);
    EXPECT_EQ(latest["gpfs:fs1"].writes, 3);
  }
  GpfsSampler none((root / "absent").string(), kSecond);  // no program: no thread, nothing
  EXPECT_TRUE(none.Latest().empty());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace trainguard
