// Storage traffic per mount of a node, from the counters the kernel and the
// parallel file system clients keep: block devices from /proc/diskstats (the
// mount's device, by major:minor from mountinfo), NFS from
// /proc/self/mountstats (bytes through the page cache and direct I/O, and
// metadata operations: OPEN, LOOKUP, GETATTR, ACCESS, CREATE, REMOVE,
// RENAME, READDIR...), Lustre from its client's llite stats (per file system
// instance, under /proc/fs/lustre or debugfs), GPFS (IBM Storage Scale) from
// `mmpmon -p`'s fs_io_s, run on a thread of its own (GpfsSampler). Pseudo and
// memory file systems, FUSE and other network file systems without such
// counters are left out. Parsing is pure; SampleMountIo reads the files.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mounts.h"

namespace trainguard {

struct MountIo {
  MountEntry mount;
  std::int64_t read_bytes = 0, write_bytes = 0;
  std::int64_t reads = 0, writes = 0;  // requests completed (block) or READ/WRITE operations (NFS)
  std::int64_t metadata_ops = -1;      // NFS, Lustre, GPFS; -1 where none are counted (block devices)
};

struct DiskCounters {
  std::int64_t reads = 0, read_sectors = 0, writes = 0, write_sectors = 0;
};
// /proc/diskstats by "major:minor".
std::map<std::string, DiskCounters> ParseDiskstats(const std::string& text);

// /proc/self/mountstats: per NFS mount point, its counters (mount left for the caller).
std::map<std::string, MountIo> ParseNfsMountstats(const std::string& text);

// One Lustre client instance's llite stats: a line per operation,
// "NAME COUNT samples [UNIT] MIN MAX SUM [SUMSQ]" (read_bytes and
// write_bytes: COUNT calls moving SUM bytes). Metadata operations: open,
// close, getattr, setattr, create, link, unlink, symlink, mkdir, rmdir,
// mknod, rename, readdir, statfs, truncate.
MountIo ParseLustreStats(const std::string& text);
// The Lustre file system a mount's source names: "mgs@tcp:/NAME[/subdir]"
// (several MGS NIDs before the colon alike); "" when it names none.
std::string LustreFsName(const std::string& source);

// `mmpmon -p` fs_io_s lines, by file system name (_fs_): _br_/_bw_ bytes
// read/written, _rdc_/_wc_ read and write calls, and as metadata _oc_ opens,
// _cc_ closes, _dir_ readdirs, _iu_ inode updates. Lines whose _rc_ is not 0
// are left out.
std::map<std::string, MountIo> ParseMmpmonFsIo(const std::string& text);

// The node's storage mounts with their counters: each block-device mount
// (one per device: the first mount point of a device stands for its bind
// mounts), each NFS mount, and the first mount of each Lustre and GPFS file
// system (`parallel`, by "lustre:NAME" and "gpfs:NAME": their clients count
// per file system, not per mount).
std::vector<MountIo> MountIoOf(const std::vector<MountEntry>& mounts, const std::map<std::string, DiskCounters>& disks,
                               const std::map<std::string, MountIo>& nfs,
                               const std::map<std::string, MountIo>& parallel = {});

// Every Lustre client instance's stats under PROC/fs/lustre/llite and
// SYS/kernel/debug/lustre/llite (newer clients), summed by "lustre:NAME".
std::map<std::string, MountIo> SampleLustre(const std::string& proc_root, const std::string& sys_root);

// Reads /proc/self/mountinfo, /proc/diskstats, /proc/self/mountstats and
// Lustre's stats; `gpfs`: GpfsSampler's latest.
std::vector<MountIo> SampleMountIo(const std::string& proc_root = "/proc", const std::string& sys_root = "/sys",
                                   const std::map<std::string, MountIo>& gpfs = {});

// Runs `mmpmon -p` (fs_io_s) every `interval` on a thread of its own when the
// program exists (it needs root and the GPFS daemon; a node without GPFS
// starts no thread), 10 s at most a run.
class GpfsSampler {
 public:
  explicit GpfsSampler(std::string mmpmon, Nanos interval);
  ~GpfsSampler();
  std::map<std::string, MountIo> Latest() const;  // by "gpfs:NAME"

 private:
  void Run();
  std::string mmpmon_;
  Nanos interval_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::map<std::string, MountIo> latest_;
  std::thread thread_;
};

}  // namespace trainguard
