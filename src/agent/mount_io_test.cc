// Per-mount counters against proc(5)'s /proc/diskstats and the kernel's
// NFS mountstats format (statvers 1.1), and this machine's own files.
#include "agent/mount_io.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace trainguard
