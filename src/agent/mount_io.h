// Storage traffic per mount of a node, from the kernel's own counters:
// block devices from /proc/diskstats (the mount's device, by major:minor
// from mountinfo), NFS from /proc/self/mountstats (bytes through the page
// cache and direct I/O, and metadata operations: OPEN, LOOKUP, GETATTR,
// ACCESS, CREATE, REMOVE, RENAME, READDIR...). Pseudo and memory file
// systems, FUSE and other network file systems without such counters are
// left out. Parsing is pure; MountIoSampler reads the files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/mounts.h"

namespace trainguard {

struct MountIo {
  MountEntry mount;
  std::int64_t read_bytes = 0, write_bytes = 0;
  std::int64_t reads = 0, writes = 0;  // requests completed (block) or READ/WRITE operations (NFS)
  std::int64_t metadata_ops = -1;      // NFS only; -1 where the kernel counts none (block devices)
};

struct DiskCounters {
  std::int64_t reads = 0, read_sectors = 0, writes = 0, write_sectors = 0;
};
// /proc/diskstats by "major:minor".
std::map<std::string, DiskCounters> ParseDiskstats(const std::string& text);

// /proc/self/mountstats: per NFS mount point, its counters (mount left for the caller).
std::map<std::string, MountIo> ParseNfsMountstats(const std::string& text);

// The node's storage mounts with their counters: each block-device mount
// (one per device: the first mount point of a device stands for its bind
// mounts) and each NFS mount.
std::vector<MountIo> MountIoOf(const std::vector<MountEntry>& mounts, const std::map<std::string, DiskCounters>& disks,
                               const std::map<std::string, MountIo>& nfs);

// Reads /proc/self/mountinfo, /proc/diskstats and /proc/self/mountstats.
std::vector<MountIo> SampleMountIo(const std::string& proc_root = "/proc");

}  // namespace trainguard
