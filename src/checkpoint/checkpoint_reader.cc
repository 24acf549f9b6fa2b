#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <regex>
#include <thread>

#include "checkpoint/checkpoint_format.h"
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

// Reads and decodes a rank's manifest, checking it against COMMIT.json when
// `commit` is given.
StatusOr<ManifestFile> LoadManifest(const std::string& dir, std::int64_t step, int rank,
                                    const CommitRecord* commit) {
  std::string path = StepPath(dir, step) + "/" + RankFileStem(rank) + ".json";
  auto text = ReadWholeFile(path);
  if (!text.ok()) return NotFound("step " + std::to_string(step) + ": manifest of rank " +
                                  std::to_string(rank) + " is missing (" + path + ")");
  if (commit != nullptr && (rank >= static_cast<int>(commit->manifest_xxh3.size()) ||
                            commit->manifest_xxh3[rank] != XXH3_64bits(text->data(), text->size()))) {
    return IoError(path + ": does not match the checksum recorded in " + kCommitFile);
  }
  auto m = DecodeManifest(*text, path);
  if (!m.ok()) return m.status();
  if (m->manifest.step != step || m->manifest.rank != rank) {
    return InvalidArgument(path + ": names step " + std::to_string(m->manifest.step) + " rank " +
                           std::to_string(m->manifest.rank));
  }
  return m;
}

StatusOr<CommitRecord> LoadCommit(const std::string& dir, std::int64_t step) {
  std::string path = StepPath(dir, step) + "/" + kCommitFile;
  auto text = ReadWholeFile(path);
  if (!text.ok()) return NotFound("step " + std::to_string(step) + " is not committed (no " +
                                  path + ")");
  return DecodeCommit(*text, path);
}

// Reads the stored range of `m` into dest, verifying every piece.
Status ReadAndVerify(const std::string& step_dir, const ManifestFile& m, char* dest, int threads) {
  std::string path = step_dir + "/" + m.data_file;
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
    auto commit = LoadCommit(dir, info.step);
    info.committed = commit.ok();
    if (commit.ok()) info.world_size = commit->world_size;
    for (const auto& f : fs::directory_iterator(entry.path(), ec)) {
      std::string fname = f.path().filename().string();
      if (fname.rfind("rank-", 0) != 0) continue;
      if (fname.size() > 5 && fname.substr(fname.size() - 5) == ".json") ++info.manifests;
      if (fname.size() > 5 && fname.substr(fname.size() - 5) == ".data") {
        info.bytes += f.file_size(ec);
      }
    }
    out.push_back(info);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

StatusOr<RankManifest> ReadManifest(const std::string& dir, std::int64_t step, int rank) {
  auto commit = LoadCommit(dir, step);
  if (!commit.ok()) return commit.status();
  auto m = LoadManifest(dir, step, rank, &commit.value());
  if (!m.ok()) return m.status();
  return m->manifest;
}

Status ReadStoredRange(const std::string& dir, std::int64_t step, int rank, void* dest,
                       std::uint64_t size, int threads) {
  auto commit = LoadCommit(dir, step);
  if (!commit.ok()) return commit.status();
  auto m = LoadManifest(dir, step, rank, &commit.value());
  if (!m.ok()) return m.status();
  if (size != m->manifest.hi - m->manifest.lo) {
    return InvalidArgument("step " + std::to_string(step) + " rank " + std::to_string(rank) +
                           ": destination holds " + std::to_string(size) + " bytes, the range " +
                           std::to_string(m->manifest.hi - m->manifest.lo));
  }
  return ReadAndVerify(StepPath(dir, step), *m, static_cast<char*>(dest), threads);
}

Status VerifyCheckpoint(const std::string& dir, std::int64_t step) {
  auto commit = LoadCommit(dir, step);
  if (!commit.ok()) return commit.status();
  std::vector<std::string> problems;
  std::vector<char> buffer;
  for (int r = 0; r < commit->world_size; ++r) {
    auto m = LoadManifest(dir, step, r, &commit.value());
    if (!m.ok()) {
      problems.push_back(m.status().message());
      continue;
    }
    buffer.resize(m->manifest.hi - m->manifest.lo + 1);
    Status s = ReadAndVerify(StepPath(dir, step), *m, buffer.data(), 2);
    if (!s.ok()) problems.push_back(s.message());
  }
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return IoError(all);
}

}  // namespace trainguard
