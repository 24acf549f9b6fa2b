// MemoryStore: where a node keeps checkpoint copies in memory
// (docs/restart.md). Two trees under one root:
//
//   ROOT/step-<N>/save-<A>-<S>/rank-<R>.data        this node's ranks' copies (.json and .commit too
//                                                     for a save to memory alone),
//                                                     written by their checkpoint engines
//   ROOT/peer/step-<N>/save-<A>-<S>/rank-<R>.data   copies another node pushed here
//
// A file is whole once it has its name: writers write NAME.tmp and rename.
// A copy fetched from a peer into the node's own tree has NAME.origin
// beside it, holding the node id it came from.
//
// The root is a tmpfs of the agent's own with transparent huge pages when
// the agent may make one (CAP_SYS_ADMIN: fsopen/fsmount, never attached to
// a directory, reached through /proc/<agent pid>/fd/<n>): mapping 2 GiB takes
// a thousand page-table entries instead of half a million, and the mount
// goes away with the agent however it ends. Otherwise a directory in the
// shared-memory directory (/dev/shm), removed when the store is.
//
// Thread safety: every method may be called from any thread; Open() is
// idempotent. File operations on distinct paths do not race (the tmp+rename
// rule).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

// A copy's place below a tree: step-<N>/save-<A>-<S>/rank-<R>.<KIND>, parsed.
// KIND: "data"; a save to memory alone (docs/checkpoint_format.md) has its
// "json" (manifest) and "commit" beside it, and they travel with it.
struct CopyPath {
  std::int64_t step = -1;
  std::string save_dir;  // save-<A>-<S>
  int rank = -1;
  std::string kind = "data";
  std::string Relative() const;  // the canonical text
};
// The kinds, in the order they are pushed and fetched: the manifest first
// (it marks a save to memory alone, which is whole only with its commit: a
// data file alone is a stored save's copy, whole by itself), the commit last.
inline constexpr const char* kCopyKinds[] = {"json", "data", "commit"};
// Parses `relative`; false for anything else (no "..", no extra parts, canonical names only).
bool ParseCopyPath(const std::string& relative, CopyPath* out);

// Removes the fallback directories in `parent` (trainguard-*-checkpoints)
// whose agent is gone: nothing holds the lock file inside, made 10 s ago or
// more (a directory being made has no lock held for an instant). An agent
// killed (SIGKILL, the OOM killer) leaves its node's checkpoint copies in
// /dev/shm, gigabytes a rank, until this runs: every agent runs it when it
// starts. Returns how many went.
int RemoveOrphanedCopies(const std::string& parent);

class MemoryStore {
 public:
  // `fallback_parent`: where the directory goes when no tmpfs of its own can be made.
  explicit MemoryStore(std::string fallback_parent, bool try_own_tmpfs = true);
  ~MemoryStore();  // removes the fallback directory; closes the tmpfs (it goes once no rank maps a file)
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // Makes the root if there is none yet (`name`: the fallback directory's).
  // Error: neither could be made.
  Status Open(const std::string& name);
  // "" until Open() succeeded.
  std::string Root() const;
  // How the root is kept, for the agent's line: "a tmpfs of its own with huge pages" or the fallback's path.
  std::string Describe() const;
  bool huge_pages() const;

  // Bytes in every file of both trees.
  std::int64_t Bytes() const;

  // This node's whole copies of `rank` at `step` (every save of the step), relative paths.
  std::vector<std::string> OwnCopies(int rank, std::int64_t step) const;
  // Whether the node's own tree holds any copy of any of `ranks`.
  bool HasOwnCopyOf(const std::vector<int>& ranks) const;

  // Writes `size` bytes that `read` supplies (it returns false on failure)
  // as the peer copy `path`, whole or not at all, then keeps only the
  // `keep` newest steps of that rank in the peer tree. kFailedPrecondition
  // (`read` not called) before Open().
  Status PutPeerCopy(const CopyPath& path, std::uint64_t size, int keep,
                     const std::function<bool(int fd, std::uint64_t size)>& read);
  // The peer tree's copies of `rank` at its newest step whose copies are
  // whole (every save), relative paths, in the order they travel.
  std::vector<std::string> NewestPeerCopies(int rank) const;
  // Writes a copy fetched from node `origin` into the own tree, as PutPeerCopy does.
  Status PutFetchedCopy(const CopyPath& path, std::uint64_t size, const std::string& origin,
                        const std::function<bool(int fd, std::uint64_t size)>& read);

 private:
  Status WriteWhole(const std::string& final_path, std::uint64_t size,
                    const std::function<bool(int fd, std::uint64_t size)>& read);
  const std::string fallback_parent_;
  const bool try_own_tmpfs_;
  mutable std::mutex mu_;
  std::string root_;
  int mount_fd_ = -1;      // the detached tmpfs (-1: the fallback directory)
  int owner_fd_ = -1;      // the fallback directory's kOwnerLock, held shared while the store lives
  bool huge_ = false;
  std::string why_fallback_;
};

}  // namespace trainguard
