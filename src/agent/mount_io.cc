#include "agent/mount_io.h"

#include <set>
#include <sstream>

#include "common/small_file.h"

namespace trainguard {
namespace {

bool IsNfs(const std::string& fstype) { return fstype == "nfs" || fstype == "nfs4"; }

}  // namespace

std::map<std::string, DiskCounters> ParseDiskstats(const std::string& text) {
  // "   8       1 sda1 4512 10 361618 1432 2045 1988 92336 6120 0 4012 7552 ..."
  std::map<std::string, DiskCounters> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string major, minor, name;
    std::int64_t v[7] = {};
    if (!(f >> major >> minor >> name)) continue;
    bool ok = true;
    for (auto& x : v) ok = ok && static_cast<bool>(f >> x);
    if (!ok) continue;
    // reads completed, reads merged, sectors read, ms reading, writes completed, writes merged, sectors written
    out[major + ":" + minor] = {v[0], v[2], v[4], v[6]};
  }
  return out;
}

std::map<std::string, MountIo> ParseNfsMountstats(const std::string& text) {
  // "device server:/export mounted on /mnt/data with fstype nfs4 statvers=1.1"
  // then, indented: "bytes:\t<normal read> <normal write> <direct read> <direct write> <server read> <server write> ..."
  // and per operation "OPEN: <ops> <transmissions> <timeouts> <bytes sent> <bytes received> ...".
  static const std::set<std::string> kMetadata = {"OPEN",   "OPEN_NOATTR", "CLOSE",   "LOOKUP",  "GETATTR", "SETATTR",
                                                  "ACCESS", "CREATE",      "REMOVE",  "RENAME",  "READDIR", "READDIRPLUS",
                                                  "MKDIR",  "RMDIR",       "LINK",    "SYMLINK", "FSSTAT",  "STATFS"};
  std::map<std::string, MountIo> out;
  MountIo* current = nullptr;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("device ", 0) == 0) {
      current = nullptr;
      const auto on = line.find(" mounted on ");
      const auto with = line.find(" with fstype ");
      if (on == std::string::npos || with == std::string::npos || with < on) continue;
      std::istringstream rest(line.substr(with + 13));
      std::string fstype;
      rest >> fstype;
      if (!IsNfs(fstype)) continue;
      const std::string point = line.substr(on + 12, with - on - 12);
      current = &out[point];
      current->mount.mount_point = point;
      current->mount.fstype = fstype;
      current->mount.source = line.substr(7, on - 7);
      current->metadata_ops = 0;
      continue;
    }
    if (current == nullptr) continue;
    std::istringstream f(line);
    std::string key;
    if (!(f >> key) || key.empty() || key.back() != ':') continue;
    key.pop_back();
    if (key == "bytes") {
      std::int64_t normal_read = 0, normal_write = 0, direct_read = 0, direct_write = 0;
      if (f >> normal_read >> normal_write >> direct_read >> direct_write) {
        current->read_bytes = normal_read + direct_read;
        current->write_bytes = normal_write + direct_write;
      }
    } else if (std::int64_t ops = 0; f >> ops) {
      if (key == "READ") current->reads = ops;
      if (key == "WRITE") current->writes = ops;
      if (kMetadata.count(key)) current->metadata_ops += ops;
    }
  }
  return out;
}

std::vector<MountIo> MountIoOf(const std::vector<MountEntry>& mounts, const std::map<std::string, DiskCounters>& disks,
                               const std::map<std::string, MountIo>& nfs) {
  std::vector<MountIo> out;
  std::set<std::string> devices;
  for (const MountEntry& m : mounts) {
    if (IsNfs(m.fstype)) {
      auto it = nfs.find(m.mount_point);
      if (it == nfs.end() || !devices.insert("nfs " + m.mount_point).second) continue;
      MountIo io = it->second;
      io.mount = m;
      out.push_back(io);
      continue;
    }
    auto d = disks.find(m.device);
    if (d == disks.end() || !devices.insert(m.device).second) continue;  // not a block device, or seen
    MountIo io;
    io.mount = m;
    io.read_bytes = d->second.read_sectors * 512;  // diskstats' sectors are 512 bytes whatever the device's
    io.write_bytes = d->second.write_sectors * 512;
    io.reads = d->second.reads;
    io.writes = d->second.writes;
    out.push_back(io);
  }
  return out;
}

std::vector<MountIo> SampleMountIo(const std::string& proc_root) {
  return MountIoOf(ParseMountinfo(ReadSmallFile(proc_root + "/self/mountinfo")),
                   ParseDiskstats(ReadSmallFile(proc_root + "/diskstats")),
                   ParseNfsMountstats(ReadSmallFile(proc_root + "/self/mountstats")));
}

}  // namespace trainguard
