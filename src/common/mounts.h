// Mounts: which file system holds a path, from /proc/PID/mountinfo, and
// whether it is shared between nodes. Pure parsing (agent and controller).
#pragma once

#include <string>
#include <vector>

namespace trainguard {

struct MountEntry {
  std::string mount_point;
  std::string fstype;
  std::string source;
  std::string device;  // "major:minor" (mountinfo's third field)
};

// /proc/PID/mountinfo's lines; mount points unescaped (\040 is a space).
std::vector<MountEntry> ParseMountinfo(const std::string& text);
// The mount that holds `path` (the longest mount point that prefixes it);
// empty fields if none.
MountEntry MountOf(const std::string& path, const std::vector<MountEntry>& mounts);
// Shared file systems (network, FUSE, parallel): a stall on them is not one
// node's fault.
bool IsSharedFilesystem(const std::string& fstype);

}  // namespace trainguard
