#include "agent/mount_io.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

#include "common/small_file.h"
#include "diag/run_program.h"

namespace trainguard {
namespace {

bool IsNfs(const std::string& fstype) { return fstype == "nfs" || fstype == "nfs4"; }

// The key of a mount's counters in MountIoOf's `parallel`, "" for other file systems.
std::string ParallelKey(const MountEntry& m) {
  if (m.fstype == "lustre") {
    const std::string name = LustreFsName(m.source);
    return name.empty() ? "" : "lustre:" + name;
  }
  if (m.fstype == "gpfs") {
    std::string name = m.source;
    if (name.rfind("/dev/", 0) == 0) name = name.substr(5);
    return "gpfs:" + name;
  }
  return "";
}

void Add(MountIo* into, const MountIo& more) {
  into->read_bytes += more.read_bytes;
  into->write_bytes += more.write_bytes;
  into->reads += more.reads;
  into->writes += more.writes;
  into->metadata_ops = std::max<std::int64_t>(0, into->metadata_ops) + std::max<std::int64_t>(0, more.metadata_ops);
}

}  // namespace

MountIo ParseLustreStats(const std::string& text) {
  // "snapshot_time             1700000000.123456789 secs.nsecs"
  // "read_bytes                500 samples [bytes] 4096 1048576 209715200 ..."
  // "open                      1234 samples [usecs] ..." (older clients: "[regs]")
  static const std::set<std::string> kMetadata = {"open",  "close", "getattr", "setattr", "create",
                                                  "link",  "unlink", "symlink", "mkdir",  "rmdir",
                                                  "mknod", "rename", "readdir", "statfs", "truncate"};
  MountIo io;
  io.metadata_ops = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string name, samples, unit;
    std::int64_t count = 0;
    if (!(f >> name >> count >> samples) || samples != "samples" || count < 0) continue;
    if (name == "read_bytes" || name == "write_bytes") {
      std::int64_t min = 0, max = 0, sum = 0;
      if (!(f >> unit >> min >> max >> sum)) continue;
      (name == "read_bytes" ? io.reads : io.writes) = count;
      (name == "read_bytes" ? io.read_bytes : io.write_bytes) = sum;
    } else if (kMetadata.count(name)) {
      io.metadata_ops += count;
    }
  }
  return io;
}

std::string LustreFsName(const std::string& source) {
  const auto colon = source.find(":/");
  if (colon == std::string::npos) return "";
  std::string name = source.substr(colon + 2);
  name = name.substr(0, name.find('/'));
  return name;
}

std::map<std::string, MountIo> ParseMmpmonFsIo(const std::string& text) {
  // "_fs_io_s_ _n_ 10.0.0.8 _nn_ node1 _rc_ 0 _t_ 1066660148 _tu_ 407431 _cl_ c1 _fs_ gpfs2 _d_ 2
  //  _br_ 6291456 _bw_ 314572800 _oc_ 10 _cc_ 16 _rdc_ 101 _wc_ 300 _dir_ 7 _iu_ 2"
  std::map<std::string, MountIo> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string tag;
    if (!(f >> tag) || tag != "_fs_io_s_") continue;
    std::map<std::string, std::string> kv;
    for (std::string key, value; f >> key >> value;) kv[key] = value;
    if (kv["_rc_"] != "0" || kv["_fs_"].empty()) continue;
    auto number = [&](const char* key, bool* ok) -> std::int64_t {
      const auto it = kv.find(key);
      try {
        std::size_t used = 0;
        const long long v = it == kv.end() ? -1 : std::stoll(it->second, &used);
        if (v < 0 || used != it->second.size()) *ok = false;
        return v;
      } catch (const std::exception&) {
        *ok = false;
        return -1;
      }
    };
    bool ok = true;
    MountIo io;
    io.read_bytes = number("_br_", &ok);
    io.write_bytes = number("_bw_", &ok);
    io.reads = number("_rdc_", &ok);
    io.writes = number("_wc_", &ok);
    io.metadata_ops = number("_oc_", &ok) + number("_cc_", &ok) + number("_dir_", &ok) + number("_iu_", &ok);
    if (ok) out["gpfs:" + kv["_fs_"]] = io;
  }
  return out;
}

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
                               const std::map<std::string, MountIo>& nfs,
                               const std::map<std::string, MountIo>& parallel) {
  std::vector<MountIo> out;
  std::set<std::string> devices;
  for (const MountEntry& m : mounts) {
    if (const std::string key = ParallelKey(m); !key.empty()) {
      auto it = parallel.find(key);
      if (it == parallel.end() || !devices.insert(key).second) continue;
      MountIo io = it->second;
      io.mount = m;
      out.push_back(io);
      continue;
    }
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

std::map<std::string, MountIo> SampleLustre(const std::string& proc_root, const std::string& sys_root) {
  std::map<std::string, MountIo> out;
  for (const std::string& root : {proc_root + "/fs/lustre/llite", sys_root + "/kernel/debug/lustre/llite"}) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      // An instance is "NAME-<superblock address>".
      const std::string instance = it->path().filename().string();
      const auto dash = instance.rfind('-');
      if (dash == std::string::npos || dash == 0) continue;
      const std::string text = ReadSmallFile((it->path() / "stats").string());
      if (text.empty()) continue;
      const std::string key = "lustre:" + instance.substr(0, dash);
      auto [entry, fresh] = out.try_emplace(key);
      if (fresh) entry->second = ParseLustreStats(text);
      else Add(&entry->second, ParseLustreStats(text));
    }
  }
  return out;
}

std::vector<MountIo> SampleMountIo(const std::string& proc_root, const std::string& sys_root,
                                   const std::map<std::string, MountIo>& gpfs) {
  const std::vector<MountEntry> mounts = ParseMountinfo(ReadSmallFile(proc_root + "/self/mountinfo"));
  std::map<std::string, MountIo> parallel = gpfs;
  bool lustre = false;
  for (const MountEntry& m : mounts) lustre = lustre || m.fstype == "lustre";
  if (lustre) parallel.merge(SampleLustre(proc_root, sys_root));
  return MountIoOf(mounts, ParseDiskstats(ReadSmallFile(proc_root + "/diskstats")),
                   ParseNfsMountstats(ReadSmallFile(proc_root + "/self/mountstats")), parallel);
}

GpfsSampler::GpfsSampler(std::string mmpmon, Nanos interval) : mmpmon_(std::move(mmpmon)), interval_(interval) {
  if (mmpmon_.empty() || access(mmpmon_.c_str(), X_OK) != 0) return;  // no GPFS here
  thread_ = std::thread([this] { Run(); });
}

GpfsSampler::~GpfsSampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::map<std::string, MountIo> GpfsSampler::Latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void GpfsSampler::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    // The request on standard input; the program's path is $0, never parsed by the shell.
    const ProgramResult r =
        RunProgram({"/bin/sh", "-c", "printf 'fs_io_s\\n' | exec \"$0\" -p -s", mmpmon_}, 10 * kSecond);
    std::map<std::string, MountIo> sample;
    if (r.started && !r.timed_out && r.exit_code == 0) sample = ParseMmpmonFsIo(r.output);
    lock.lock();
    latest_ = std::move(sample);
    wake_.wait_for(lock, std::chrono::nanoseconds(interval_), [this] { return stop_; });
  }
}

}  // namespace trainguard
