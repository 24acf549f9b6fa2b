#include "common/mounts.h"

#include <cctype>
#include <set>
#include <sstream>

namespace trainguard {
namespace {

std::string Unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto digit = [&](std::size_t at) { return std::isdigit(static_cast<unsigned char>(s[at])) != 0; };
    if (s[i] == '\\' && i + 3 < s.size() && digit(i + 1) && digit(i + 2) && digit(i + 3)) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::vector<MountEntry> ParseMountinfo(const std::string& text) {
  // "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
  std::vector<MountEntry> mounts;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::vector<std::string> before;
    std::string word;
    while (f >> word && word != "-") before.push_back(word);
    MountEntry m;
    if (before.size() < 5 || !(f >> m.fstype >> m.source)) continue;
    m.mount_point = Unescape(before[4]);
    m.device = before[2];
    mounts.push_back(m);
  }
  return mounts;
}

MountEntry MountOf(const std::string& path, const std::vector<MountEntry>& mounts) {
  MountEntry best;
  std::size_t best_len = 0;
  bool found = false;
  for (const MountEntry& m : mounts) {  // the last of equal mount points is on top
    const std::string& p = m.mount_point;
    bool prefix = p == "/" || path == p || (path.compare(0, p.size(), p) == 0 && path.size() > p.size() && path[p.size()] == '/');
    if (prefix && (!found || p.size() >= best_len)) {
      best = m;
      best_len = p.size();
      found = true;
    }
  }
  return best;
}

bool IsSharedFilesystem(const std::string& fstype) {
  static const std::set<std::string> shared = {"nfs",    "nfs4",  "cifs",   "smb3",   "lustre", "gpfs",
                                               "beegfs", "ceph",  "glusterfs", "9p",  "wekafs", "virtiofs",
                                               "fuse",   "fuseblk", "panfs", "orangefs"};
  return shared.count(fstype) > 0 || fstype.rfind("fuse.", 0) == 0;
}

}  // namespace trainguard
