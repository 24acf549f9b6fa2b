#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <regex>
#include <thread>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/commit.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/parallel.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

namespace fs = std::filesystem;

namespace {

std::string StepPath(const std::string& dir, std::int64_t step) {
  return dir + "/" + StepDirName(step);
}

// Reads the stored range of `m` into dest, verifying every piece.
Status ReadAndVerify(const std::string& save_dir, const ManifestFile& m, char* dest, int threads) {
  std::string path = save_dir + "/" + m.data_file;
  std::uint64_t size = m.manifest.hi - m.manifest.lo;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(ErrnoMessage("open", path));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) {
    close(fd);
    return IoError(path + ": holds " + std::to_string(st.st_size) + " bytes, the manifest says " +
                   std::to_string(size));
  }
  // Segments cover the range: the checksummed pieces and the padding between
  // them. Each is read in 4 MiB chunks, and a piece's checksum is updated
  // right after each chunk, while the chunk is still in the cache.
  struct Segment {
    std::uint64_t offset, length;  // in the range
    const StoredPiece* piece;      // nullptr for padding
  };
  std::vector<const StoredPiece*> sorted;
  for (const auto& p : m.pieces) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return x->offset < y->offset; });
  std::vector<Segment> segments;
  std::uint64_t cursor = 0;
  for (const StoredPiece* p : sorted) {
    std::uint64_t at = p->offset - m.manifest.lo;
    if (at > cursor) segments.push_back({cursor, at - cursor, nullptr});
    segments.push_back({at, p->length, p});
    cursor = at + p->length;
  }
  if (size > cursor) segments.push_back({cursor, size - cursor, nullptr});
  constexpr std::uint64_t kChunk = 4ULL << 20;
  std::mutex mu;
  Status error;
  std::vector<std::uint64_t> bad;
  ParallelFor(segments.size(), threads, [&](std::size_t i) {
    const Segment& seg = segments[i];
    XXH3_state_t* state = seg.piece != nullptr ? XXH3_createState() : nullptr;
    if (state != nullptr) XXH3_64bits_reset(state);
    for (std::uint64_t off = 0; off < seg.length;) {
      std::uint64_t len = std::min(kChunk, seg.length - off), done = 0;
      char* at = dest + seg.offset + off;
      while (done < len) {
        ssize_t n = pread(fd, at + done, len - done, static_cast<off_t>(seg.offset + off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          std::lock_guard<std::mutex> lock(mu);
          if (error.ok()) error = IoError(ErrnoMessage("read", path));
          if (state != nullptr) XXH3_freeState(state);
          return;
        }
        done += static_cast<std::uint64_t>(n);
      }
      if (state != nullptr) XXH3_64bits_update(state, at, len);
      off += len;
    }
    if (state != nullptr) {
      if (XXH3_64bits_digest(state) != seg.piece->xxh3) {
        std::lock_guard<std::mutex> lock(mu);
        bad.push_back(seg.piece->offset);
      }
      XXH3_freeState(state);
    }
  });
  close(fd);
  if (!error.ok()) return error;
  if (!bad.empty()) {
    return IoError(path + ": checksum mismatch in " + std::to_string(bad.size()) +
                   " piece(s), first at stream offset " +
                   std::to_string(*std::min_element(bad.begin(), bad.end())));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("no checkpoint directory " + dir);
  static const std::regex kStepDir("step-([0-9]{12})");
  std::vector<CheckpointInfo> out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !std::regex_match(name, m, kStepDir)) continue;
    CheckpointInfo info;
    info.step = std::stoll(m[1]);
    info.path = entry.path().string();
    StepScan scan = ScanStep(info.path);
    info.committed = scan.has_commit;
    info.problem = scan.commit_problem;
    std::vector<SaveId> counted = scan.saves;
    if (scan.has_commit) {
      info.world_size = scan.commit.world_size;
      info.save = scan.commit.save.DirName();
      counted = {scan.commit.save};
      info.complete = true;
      for (int r = 0; r < scan.commit.world_size && info.complete; ++r) {
        auto man = LoadManifest(info.path, info.step, scan.commit.save, r, &scan.commit);
        std::uint64_t want = man.ok() ? man->manifest.hi - man->manifest.lo : 0;
        std::string data = man.ok() ? info.path + "/" + info.save + "/" + man->data_file : "";
        std::error_code size_ec;
        if (!man.ok()) {
          info.complete = false;
          info.problem = man.status().message();
        } else if (fs::file_size(data, size_ec) != want || size_ec) {
          info.complete = false;
          info.problem = data + (size_ec ? " is missing" : " has the wrong size");
        }
      }
    }
    for (const SaveId& save : counted) {
      for (const auto& f : fs::directory_iterator(info.path + "/" + save.DirName(), ec)) {
        std::string fname = f.path().filename().string();
        if (fname.rfind("rank-", 0) != 0 || fname.size() <= 5) continue;
        std::string ext = fname.substr(fname.size() - 5);
        if (ext == ".json") ++info.manifests;
        if (ext == ".data") info.bytes += f.file_size(ec);
      }
    }
    out.push_back(info);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

StatusOr<RankManifest> ReadManifest(const std::string& dir, std::int64_t step, int rank) {
  std::string step_dir = StepPath(dir, step);
  auto commit = LoadCommit(step_dir);
  if (!commit.ok()) return Status(commit.status().code(), "step " + std::to_string(step) + ": " +
                                                              commit.status().message());
  auto m = LoadManifest(step_dir, step, commit->save, rank, &commit.value());
  if (!m.ok()) return m.status();
  return m->manifest;
}

Status ReadStoredRange(const std::string& dir, const RankManifest& manifest, void* dest,
                       std::uint64_t size, int threads) {
  std::int64_t step = manifest.step;
  std::string step_dir = StepPath(dir, step);
  SaveId save{manifest.attempt, manifest.sequence};
  auto commit = LoadCommit(step_dir);
  if (!commit.ok()) return Status(commit.status().code(), "step " + std::to_string(step) + ": " +
                                                              commit.status().message());
  if (commit->save != save) {
    return FailedPrecondition("step " + std::to_string(step) + " was re-committed to " +
                              commit->save.DirName() + " while " + save.DirName() +
                              " was being read");
  }
  auto m = LoadManifest(step_dir, step, save, manifest.rank, &commit.value());
  if (!m.ok()) return m.status();
  if (size != m->manifest.hi - m->manifest.lo) {
    return InvalidArgument("step " + std::to_string(step) + " rank " + std::to_string(manifest.rank) +
                           ": destination holds " + std::to_string(size) + " bytes, the range " +
                           std::to_string(m->manifest.hi - m->manifest.lo));
  }
  return ReadAndVerify(step_dir + "/" + save.DirName(), *m, static_cast<char*>(dest), threads);
}

namespace {

// The stored manifest of `manifest`'s save, if COMMIT.json still names it.
StatusOr<ManifestFile> CommittedManifest(const std::string& dir, const RankManifest& manifest) {
  std::string step_dir = StepPath(dir, manifest.step);
  SaveId save{manifest.attempt, manifest.sequence};
  auto commit = LoadCommit(step_dir);
  if (!commit.ok()) return commit.status();
  if (commit->save != save) return FailedPrecondition("the step was re-committed to " + commit->save.DirName());
  return LoadManifest(step_dir, manifest.step, save, manifest.rank, &commit.value());
}

// Why the node's memory has no copy of this save ("" when it has nothing of the step).
std::string NoCopyReason(const std::string& memory_dir, const RankManifest& manifest) {
  SaveId save{manifest.attempt, manifest.sequence};
  std::string step_dir = memory_dir + "/" + StepDirName(manifest.step);
  std::error_code ec;
  if (fs::exists(step_dir + "/" + save.DirName(), ec)) {
    return "the node's memory has no copy of rank " + std::to_string(manifest.rank) + "'s part";
  }
  if (fs::exists(step_dir, ec)) {
    return "the node's memory holds another save of step " + std::to_string(manifest.step) + ", not " +
           save.DirName();
  }
  return "";
}

}  // namespace

Status ReadStoredRange(const std::string& dir, const RankManifest& manifest, void* dest,
                       std::uint64_t size, int threads, const std::string& memory_dir,
                       std::string* source, std::string* memory_problem) {
  *source = "storage";
  memory_problem->clear();
  if (memory_dir.empty()) return ReadStoredRange(dir, manifest, dest, size, threads);
  // The stored commit and manifest decide what is right; the memory copy
  // only supplies bytes, checked exactly as the stored ones are.
  auto m = CommittedManifest(dir, manifest);
  if (!m.ok() || size != m->manifest.hi - m->manifest.lo) return ReadStoredRange(dir, manifest, dest, size, threads);
  SaveId save{manifest.attempt, manifest.sequence};
  std::string copy_dir = memory_dir + "/" + StepDirName(manifest.step) + "/" + save.DirName();
  struct stat st;
  if (stat((copy_dir + "/" + m->data_file).c_str(), &st) != 0) {
    *memory_problem = NoCopyReason(memory_dir, manifest);  // another save's copy is never looked at
    return ReadStoredRange(dir, manifest, dest, size, threads);
  }
  Status s = ReadAndVerify(copy_dir, *m, static_cast<char*>(dest), threads);
  if (s.ok()) {
    *source = "memory";
    return s;
  }
  *memory_problem = s.message();
  return ReadStoredRange(dir, manifest, dest, size, threads);
}

namespace {

// The data file at `path`, mapped privately and verified in place against
// `m`'s checksums.
StatusOr<MappedRange> MapVerified(const std::string& path, const ManifestFile& m, int threads,
                                  const std::function<std::string()>& missing) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(missing());
  std::uint64_t size = m.manifest.hi - m.manifest.lo;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) {
    close(fd);
    return FailedPrecondition(path + ": holds " + std::to_string(st.st_size) + " bytes, the manifest says " +
                              std::to_string(size));
  }
  // Private and writable (a restored tensor may be updated in place: the
  // write copies that page, the copy is unchanged), prefaulted for reading
  // only: MAP_POPULATE on a private writable mapping would copy every page.
  void* data = size == 0 ? nullptr : mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  close(fd);
  if (data == MAP_FAILED) return IoError(ErrnoMessage("map", path));
#ifdef MADV_POPULATE_READ
  if (size > 0) (void)madvise(data, size, MADV_POPULATE_READ);  // older kernels: faults while verifying
#endif
  std::vector<std::uint64_t> bad;
  std::mutex mu;
  const char* base = static_cast<const char*>(data);
  ParallelFor(m.pieces.size(), threads, [&](std::size_t i) {
    const StoredPiece& p = m.pieces[i];
    bool inside = p.offset >= m.manifest.lo && p.offset + p.length <= m.manifest.hi;
    if (!inside || XXH3_64bits(base + (p.offset - m.manifest.lo), p.length) != p.xxh3) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back(p.offset);
    }
  });
  if (!bad.empty()) {
    munmap(data, size);
    return FailedPrecondition(path + ": checksum mismatch in " + std::to_string(bad.size()) +
                              " piece(s), first at stream offset " +
                              std::to_string(*std::min_element(bad.begin(), bad.end())));
  }
  MappedRange range{data, size, ""};
  if (std::FILE* f = std::fopen((path + ".origin").c_str(), "r")) {  // fetched from a peer (docs/restart.md)
    char node[256] = {0};
    std::size_t n = std::fread(node, 1, sizeof(node) - 1, f);
    std::fclose(f);
    range.origin = std::string(node, n);
  }
  return range;
}

}  // namespace

StatusOr<MappedRange> MapMemoryCopy(const std::string& dir, const RankManifest& manifest,
                                    const std::string& memory_dir, int threads) {
  auto m = CommittedManifest(dir, manifest);
  if (!m.ok()) return NotFound("");  // storage's own read says what is wrong
  SaveId save{manifest.attempt, manifest.sequence};
  std::string path = memory_dir + "/" + StepDirName(manifest.step) + "/" + save.DirName() + "/" + m->data_file;
  return MapVerified(path, *m, threads, [&] { return NoCopyReason(memory_dir, manifest); });
}

std::vector<MemorySaveInfo> ListMemorySaves(const std::string& memory_dir, int rank) {
  std::vector<MemorySaveInfo> out;
  std::error_code ec;
  const std::string marker = RankFileStem(rank) + ".commit";
  for (const auto& step_entry : fs::directory_iterator(memory_dir, ec)) {
    long long step = -1;
    char tail = 0;
    if (std::sscanf(step_entry.path().filename().c_str(), "step-%12lld%c", &step, &tail) != 1 || step < 0) continue;
    std::error_code ec2;
    for (const auto& save_entry : fs::directory_iterator(step_entry.path(), ec2)) {
      SaveId id;
      if (!ParseSaveDirName(save_entry.path().filename().string(), &id)) continue;
      const std::string path = (save_entry.path() / marker).string();
      auto text = ReadWholeFile(path);
      if (!text.ok()) continue;
      auto commit = DecodeMemoryCommit(*text, path);  // a damaged one is named when it is read (MapMemorySave)
      out.push_back({step, id.attempt, id.sequence, commit.ok() ? commit->created_unix_ms : 0});
    }
  }
  std::sort(out.begin(), out.end(), [](const MemorySaveInfo& a, const MemorySaveInfo& b) {
    if (a.step != b.step) return a.step > b.step;
    return a.created_unix_ms != b.created_unix_ms ? a.created_unix_ms > b.created_unix_ms : a.sequence > b.sequence;
  });
  return out;
}

StatusOr<MemoryRestore> MapMemorySave(const std::string& memory_dir, std::int64_t step, int rank,
                                      const std::string& attempt, std::int64_t sequence, int threads) {
  const SaveId save{attempt, sequence};
  const std::string step_dir = memory_dir + "/" + StepDirName(step);
  const std::string stem = step_dir + "/" + save.DirName() + "/" + RankFileStem(rank);
  auto text = ReadWholeFile(stem + ".commit");
  if (!text.ok()) return NotFound(stem + ".commit: missing: the save is not committed in this node's memory");
  auto commit = DecodeMemoryCommit(*text, stem + ".commit");
  if (!commit.ok()) return commit.status();
  if (commit->step != step || commit->save != save || commit->rank != rank) {
    return InvalidArgument(stem + ".commit: names step " + std::to_string(commit->step) + " rank " +
                           std::to_string(commit->rank) + " save " + commit->save.DirName());
  }
  CommitRecord binds;  // LoadManifest checks the manifest against a commit's checksums
  binds.manifest_xxh3.assign(static_cast<std::size_t>(rank) + 1, 0);
  binds.manifest_xxh3[rank] = commit->manifest_xxh3;
  auto m = LoadManifest(step_dir, step, save, rank, &binds);
  if (!m.ok()) return m.status();
  if (m->manifest.world_size != commit->world_size) {
    return InvalidArgument(stem + ".json: world size " + std::to_string(m->manifest.world_size) +
                           ", its commit says " + std::to_string(commit->world_size));
  }
  auto mapped = MapVerified(step_dir + "/" + save.DirName() + "/" + m->data_file, *m, threads,
                            [&] { return stem + ".data: missing"; });
  if (!mapped.ok()) return mapped.status();
  return MemoryRestore{m->manifest, *mapped};
}

Status VerifyCheckpoint(const std::string& dir, std::int64_t step) {
  std::string step_dir = StepPath(dir, step);
  auto commit = LoadCommit(step_dir);
  if (!commit.ok()) return Status(commit.status().code(), "step " + std::to_string(step) + ": " +
                                                              commit.status().message());
  std::vector<std::string> problems;
  std::vector<char> buffer;
  for (int r = 0; r < commit->world_size; ++r) {
    auto m = LoadManifest(step_dir, step, commit->save, r, &commit.value());
    if (!m.ok()) {
      problems.push_back(m.status().message());
      continue;
    }
    buffer.resize(m->manifest.hi - m->manifest.lo + 1);
    Status s = ReadAndVerify(step_dir + "/" + commit->save.DirName(), *m, buffer.data(), 2);
    if (!s.ok()) problems.push_back(s.message());
  }
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return IoError(all);
}

}  // namespace trainguard
