#include "agent/memory_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

namespace trainguard {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPeerTree = "peer";
constexpr const char* kTmpSuffix = ".tmp";
constexpr const char* kOriginSuffix = ".origin";

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// A tmpfs with huge pages of the agent's own, never attached to a directory:
// its fd, or -1 with `why`.
int MakeOwnTmpfs(bool* huge, std::string* why) {
  for (bool with_huge : {true, false}) {
    int fs_fd = fsopen("tmpfs", FSOPEN_CLOEXEC);
    if (fs_fd < 0) {
      *why = Errno("fsopen tmpfs");
      return -1;
    }
    bool ok = fsconfig(fs_fd, FSCONFIG_SET_STRING, "mode", "0700", 0) == 0 &&
              (!with_huge || fsconfig(fs_fd, FSCONFIG_SET_STRING, "huge", "within_size", 0) == 0) &&
              fsconfig(fs_fd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0;
    int mount_fd = ok ? fsmount(fs_fd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC) : -1;
    if (mount_fd < 0) *why = Errno(ok ? "fsmount tmpfs" : "fsconfig tmpfs");
    close(fs_fd);
    if (mount_fd >= 0) {
      *huge = with_huge;
      return mount_fd;
    }
  }
  return -1;
}

// `rank`'s whole copies below `tree`, relative paths, by step, newest first.
std::map<std::int64_t, std::vector<std::string>, std::greater<>> CopiesByStep(const std::string& tree, int rank) {
  std::map<std::int64_t, std::vector<std::string>, std::greater<>> by_step;
  std::error_code ec;
  for (const auto& step : fs::directory_iterator(tree, ec)) {
    long long n = -1;
    if (std::sscanf(step.path().filename().c_str(), "step-%lld", &n) != 1) continue;
    std::error_code ec2;
    for (const auto& save : fs::directory_iterator(step.path(), ec2)) {
      for (const char* kind : kCopyKinds) {
        CopyPath p{n, save.path().filename().string(), rank, kind}, parsed;
        std::error_code ec3;
        if (ParseCopyPath(p.Relative(), &parsed) && fs::is_regular_file(tree + "/" + p.Relative(), ec3)) {
          by_step[n].push_back(p.Relative());
        }
      }
    }
  }
  return by_step;
}

// Copies in the order they travel: by save, a commit after what it binds.
void SortForTransfer(std::vector<std::string>* relatives) {
  auto key = [](const std::string& relative) {
    CopyPath p;
    ParseCopyPath(relative, &p);
    const auto kind = std::find(std::begin(kCopyKinds), std::end(kCopyKinds), p.kind) - std::begin(kCopyKinds);
    return std::make_tuple(p.step, p.save_dir, p.rank, kind);
  };
  std::sort(relatives->begin(), relatives->end(),
            [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
}

// Whether a step's copies (of one rank) are whole: a stored save's copy is
// its data file; a save to memory alone needs its commit, which travels last.
bool Whole(const std::vector<std::string>& files) {
  bool manifest = false, commit = false;
  for (const auto& f : files) {
    manifest = manifest || f.ends_with(".json");
    commit = commit || f.ends_with(".commit");
  }
  return commit || !manifest;
}

}  // namespace

std::string CopyPath::Relative() const {
  char step_dir[40];
  std::snprintf(step_dir, sizeof(step_dir), "step-%012lld", static_cast<long long>(step));
  char rank_file[32];
  std::snprintf(rank_file, sizeof(rank_file), "rank-%05d.%s", rank, kind.c_str());
  return std::string(step_dir) + "/" + save_dir + "/" + rank_file;
}

bool ParseCopyPath(const std::string& relative, CopyPath* out) {
  std::size_t a = relative.find('/');
  std::size_t b = a == std::string::npos ? a : relative.find('/', a + 1);
  if (b == std::string::npos || relative.find('/', b + 1) != std::string::npos) return false;
  long long step = -1;
  int rank = -1;
  char tail = 0;
  std::string step_part = relative.substr(0, a), rank_part = relative.substr(b + 1);
  if (std::sscanf(step_part.c_str(), "step-%12lld%c", &step, &tail) != 1 || step < 0) return false;
  int used = 0;
  if (std::sscanf(rank_part.c_str(), "rank-%5d.%n", &rank, &used) != 1 || used == 0 || rank < 0) return false;
  const std::string kind = rank_part.substr(static_cast<std::size_t>(used));
  if (std::find(std::begin(kCopyKinds), std::end(kCopyKinds), kind) == std::end(kCopyKinds)) return false;
  std::string save = relative.substr(a + 1, b - a - 1);
  if (save.rfind("save-", 0) != 0 || save.size() > 100) return false;
  for (char c : save) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  out->step = step;
  out->save_dir = save;
  out->rank = rank;
  out->kind = kind;
  return out->Relative() == relative;  // canonical only
}

MemoryStore::MemoryStore(std::string fallback_parent, bool try_own_tmpfs)
    : fallback_parent_(std::move(fallback_parent)), try_own_tmpfs_(try_own_tmpfs) {}

namespace {
constexpr const char* kOwnerLock = ".agent-lock";
constexpr auto kOrphanMinAge = std::chrono::seconds(10);
}  // namespace

int RemoveOrphanedCopies(const std::string& parent) {
  int removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string suffix = "-checkpoints";
    if (name.rfind("trainguard-", 0) != 0 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string lock = entry.path().string() + "/" + kOwnerLock;
    std::error_code time_ec;
    const auto made = fs::last_write_time(lock, time_ec);
    if (time_ec || now - made < kOrphanMinAge) continue;  // none (an older agent's), or just made
    const int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    // Its agent holds a shared lock while it lives; the kernel drops it
    // when the agent ends, however it ends, in whatever pid namespace.
    const bool orphaned = flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (orphaned) {
      std::error_code rm_ec;
      if (fs::remove_all(entry.path(), rm_ec) > 0 && !rm_ec) ++removed;
    }
    close(fd);
  }
  return removed;
}

MemoryStore::~MemoryStore() {
  if (mount_fd_ >= 0) {
    close(mount_fd_);
  } else if (!root_.empty()) {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  if (owner_fd_ >= 0) close(owner_fd_);
}

Status MemoryStore::Open(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!root_.empty()) return Status::Ok();
  if (try_own_tmpfs_) {
    mount_fd_ = MakeOwnTmpfs(&huge_, &why_fallback_);
    if (mount_fd_ >= 0) {
      root_ = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(mount_fd_);
      return Status::Ok();
    }
  } else {
    why_fallback_ = "not asked to make a tmpfs";
  }
  std::string dir = fallback_parent_ + "/" + name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("node memory copies: cannot make " + dir + ": " + ec.message());
  // Held while the store lives: an agent starting on this host later knows
  // the directory is in use (RemoveOrphanedCopies).
  const std::string owner = dir + "/" + kOwnerLock;
  owner_fd_ = open(owner.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
  if (owner_fd_ < 0 || flock(owner_fd_, LOCK_SH) != 0) {
    Status failed = IoError("node memory copies: cannot lock " + owner + ": " + std::strerror(errno));
    if (owner_fd_ >= 0) close(owner_fd_);
    owner_fd_ = -1;
    fs::remove_all(dir, ec);
    return failed;
  }
  root_ = dir;
  return Status::Ok();
}

std::string MemoryStore::Root() const {
  std::lock_guard<std::mutex> lock(mu_);
  return root_;
}

bool MemoryStore::huge_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return huge_;
}

std::string MemoryStore::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (mount_fd_ >= 0) return root_ + std::string(" (a tmpfs of the agent's own") + (huge_ ? ", huge pages)" : ")");
  return root_ + " (" + why_fallback_ + ")";
}

std::int64_t MemoryStore::Bytes() const {
  std::string root = Root();
  std::int64_t bytes = 0;
  if (root.empty()) return 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) bytes += static_cast<std::int64_t>(it->file_size(size_ec));
  }
  return bytes;
}

std::vector<std::string> MemoryStore::OwnCopies(int rank, std::int64_t step) const {
  std::vector<std::string> found;
  std::string root = Root();
  if (root.empty()) return found;
  CopyPath want{step, "", rank};
  std::string step_dir = want.Relative().substr(0, want.Relative().find('/'));
  std::error_code ec;
  for (const auto& save : fs::directory_iterator(root + "/" + step_dir, ec)) {
    for (const char* kind : kCopyKinds) {
      CopyPath p{step, save.path().filename().string(), rank, kind};
      std::error_code ec2;
      if (fs::is_regular_file(root + "/" + p.Relative(), ec2)) found.push_back(p.Relative());
    }
  }
  SortForTransfer(&found);
  return found;
}

bool MemoryStore::HasOwnCopyOf(const std::vector<int>& ranks) const {
  std::string root = Root();
  if (root.empty()) return false;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it.depth() == 0 && it->path().filename() == kPeerTree) {
      it.disable_recursion_pending();
      continue;
    }
    CopyPath p;
    const fs::path& f = it->path();  // not fs::relative: the root may be a /proc/<pid>/fd link
    if (it.depth() == 2 &&
        ParseCopyPath((f.parent_path().parent_path().filename() / f.parent_path().filename() / f.filename()).string(),
                      &p) &&
        std::find(ranks.begin(), ranks.end(), p.rank) != ranks.end()) {
      return true;
    }
  }
  return false;
}

Status MemoryStore::WriteWhole(const std::string& final_path, std::uint64_t size,
                               const std::function<bool(int fd, std::uint64_t size)>& read) {
  std::error_code ec;
  fs::create_directories(fs::path(final_path).parent_path(), ec);
  if (ec) return IoError("node memory copies: " + ec.message() + ": " + final_path);
  std::string tmp = final_path + kTmpSuffix;
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);  // RDWR: `read` may map it
  if (fd < 0) return IoError(Errno("open " + tmp));
  bool ok = read(fd, size);
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) {
    unlink(tmp.c_str());
    return IoError("node memory copies: " + final_path + " not written whole");
  }
  return Status::Ok();
}

Status MemoryStore::PutPeerCopy(const CopyPath& path, std::uint64_t size, int keep,
                                const std::function<bool(int fd, std::uint64_t size)>& read) {
  if (Root().empty()) return FailedPrecondition("no job runs here yet");
  const std::string peer = Root() + "/" + kPeerTree;
  if (Status s = WriteWhole(peer + "/" + path.Relative(), size, read); !s.ok()) return s;
  // The `keep` newest steps holding this rank's whole copy stay; older
  // ones go. A save to memory alone still arriving (or never finished: its
  // sender died) is not whole and keeps the older steps: it may never be.
  const auto by_step = CopiesByStep(peer, path.rank);
  int kept = 0;
  for (const auto& [step, files] : by_step) {
    if (kept < std::max(keep, 1)) {
      kept += Whole(files) ? 1 : 0;
      continue;
    }
    for (const auto& relative : files) {
      const fs::path f = peer + "/" + relative;
      unlink(f.c_str());
      rmdir(f.parent_path().c_str());                // when no other rank's copy is left
      rmdir(f.parent_path().parent_path().c_str());
    }
  }
  return Status::Ok();
}

std::vector<std::string> MemoryStore::NewestPeerCopies(int rank) const {
  std::string root = Root();
  if (root.empty()) return {};
  for (const auto& [step, files] : CopiesByStep(root + "/" + kPeerTree, rank)) {
    if (!Whole(files)) continue;  // a save to memory alone whose commit never came
    std::vector<std::string> newest = files;
    SortForTransfer(&newest);
    return newest;
  }
  return {};
}

Status MemoryStore::PutFetchedCopy(const CopyPath& path, std::uint64_t size, const std::string& origin,
                                   const std::function<bool(int fd, std::uint64_t size)>& read) {
  if (Root().empty()) return FailedPrecondition("no job runs here yet");
  const std::string file = Root() + "/" + path.Relative();
  // The origin first: a whole copy always says where it came from.
  Status s = WriteWhole(file + kOriginSuffix, origin.size(), [&](int fd, std::uint64_t) {
    return write(fd, origin.data(), origin.size()) == static_cast<ssize_t>(origin.size());
  });
  if (!s.ok()) return s;
  s = WriteWhole(file, size, read);
  if (!s.ok()) unlink((file + kOriginSuffix).c_str());
  return s;
}

}  // namespace trainguard
