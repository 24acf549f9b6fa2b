#include "checkpoint/commit.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "checkpoint/files.h"

namespace trainguard {

namespace fs = std::filesystem;

namespace {

std::string ManifestPath(const std::string& step_dir, const SaveId& save, int rank) {
  return step_dir + "/" + save.DirName() + "/" + RankFileStem(rank) + ".json";
}

// A save that will never be committed, seen by the committer of `committed`.
bool IsDebris(const SaveId& save, const StepScan& scan, const SaveId& committed) {
  if (scan.has_commit && scan.commit.save == save) return false;
  if (save.attempt != committed.attempt) return true;    // an attempt that is over
  return save.sequence < committed.sequence;             // an earlier save of ours, abandoned
}

bool IsInProgress(const SaveId& save, const SaveId& committed) {
  return save.attempt == committed.attempt && save.sequence > committed.sequence;
}

}  // namespace

StatusOr<CommitRecord> LoadCommit(const std::string& step_dir) {
  std::string path = step_dir + "/" + kCommitFile;
  auto text = ReadWholeFile(path);
  if (!text.ok()) return NotFound("not committed (no " + path + ")");
  return DecodeCommit(*text, path);
}

StatusOr<ManifestFile> LoadManifest(const std::string& step_dir, std::int64_t step,
                                    const SaveId& save, int rank, const CommitRecord* commit) {
  std::string path = ManifestPath(step_dir, save, rank);
  auto text = ReadWholeFile(path);
  if (!text.ok()) {
    return NotFound("step " + std::to_string(step) + ": manifest of rank " + std::to_string(rank) +
                    " is missing (" + path + ")");
  }
  if (commit != nullptr && (rank >= static_cast<int>(commit->manifest_xxh3.size()) ||
                            commit->manifest_xxh3[rank] != XXH3_64bits(text->data(), text->size()))) {
    return IoError(path + ": does not match the checksum recorded in " + kCommitFile);
  }
  auto m = DecodeManifest(*text, path);
  if (!m.ok()) return m.status();
  const RankManifest& got = m->manifest;
  if (got.step != step || got.rank != rank || got.attempt != save.attempt ||
      got.sequence != save.sequence) {
    return InvalidArgument(path + ": names step " + std::to_string(got.step) + " rank " +
                           std::to_string(got.rank) + " save " +
                           SaveId{got.attempt, got.sequence}.DirName());
  }
  return m;
}

StepScan ScanStep(const std::string& step_dir) {
  StepScan scan;
  auto commit = LoadCommit(step_dir);
  if (commit.ok()) {
    scan.has_commit = true;
    scan.commit = std::move(commit).value();
  } else if (commit.status().code() != StatusCode::kNotFound) {
    scan.commit_problem = commit.status().message();
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(step_dir, ec)) {
    SaveId id;
    if (entry.is_directory(ec) && ParseSaveDirName(entry.path().filename().string(), &id)) {
      scan.saves.push_back(id);
    }
  }
  return scan;
}

StatusOr<CommitResult> CommitIfComplete(const std::string& step_dir, std::int64_t step,
                                        const SaveId& save, int world_size,
                                        std::int64_t now_unix_ms) {
  auto existing = LoadCommit(step_dir);
  if (existing.ok()) {
    if (existing->save == save) return CommitResult::kCommitted;
    if (existing->save.attempt == save.attempt && existing->save.sequence > save.sequence) {
      return CommitResult::kSuperseded;
    }
  }
  CommitRecord c;
  c.step = step;
  c.save = save;
  c.world_size = world_size;
  c.created_unix_ms = now_unix_ms;
  for (int r = 0; r < world_size; ++r) {
    std::string path = ManifestPath(step_dir, save, r);
    auto text = ReadWholeFile(path);
    if (!text.ok()) return CommitResult::kWaiting;
    auto m = DecodeManifest(*text, path);
    if (!m.ok()) return IoError("not committing step " + std::to_string(step) + ": " + m.status().message());
    const RankManifest& got = m->manifest;
    if (got.step != step || got.rank != r || got.attempt != save.attempt ||
        got.sequence != save.sequence || got.world_size != world_size) {
      return IoError("not committing step " + std::to_string(step) + ": " + path +
                     " belongs to another save (step " + std::to_string(got.step) + ", rank " +
                     std::to_string(got.rank) + ", world size " + std::to_string(got.world_size) +
                     ", " + SaveId{got.attempt, got.sequence}.DirName() + ")");
    }
    c.manifest_xxh3.push_back(XXH3_64bits(text->data(), text->size()));
  }
  TG_RETURN_IF_ERROR(WriteFileAtomic(step_dir + "/" + kCommitFile, EncodeCommit(c)));
  return CommitResult::kCommitted;
}

Status RetireStep(const std::string& dir, const std::string& name) {
  std::string from = dir + "/" + name;
  std::string to = dir + "/" + kRetiringPrefix + name + "-" + RandomHex();
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    if (errno == ENOENT) return Status::Ok();  // already gone
    return IoError(ErrnoMessage("retire (rename)", from));
  }
  // The rename must be durable before any file of the step is deleted: a
  // crash then leaves the step whole and visible, or invisible.
  TG_RETURN_IF_ERROR(FsyncDir(dir));
  std::error_code ec;
  fs::remove_all(to, ec);
  if (ec) return IoError("cannot delete " + to + ": " + ec.message());
  return Status::Ok();
}

Status Retain(const std::string& dir, std::int64_t newest, const SaveId& committed, int keep_last,
              std::int64_t verified) {
  static const std::regex kStepDir("step-([0-9]{12})");
  std::vector<std::pair<std::int64_t, std::string>> steps;
  std::vector<std::string> problems;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    std::smatch m;
    if (name.rfind(kRetiringPrefix, 0) == 0) {
      std::error_code rm;
      fs::remove_all(entry.path(), rm);  // a retirement that was interrupted
    } else if (entry.is_directory(ec) && std::regex_match(name, m, kStepDir)) {
      steps.emplace_back(std::stoll(m[1]), name);
    }
  }
  if (ec) return IoError("cannot list " + dir + ": " + ec.message());
  std::sort(steps.begin(), steps.end(), std::greater<>());
  int kept = 0;
  bool verified_kept = false;
  std::int64_t oldest_committed = -1;
  if (verified == -2) {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (it->first <= newest && ScanStep(dir + "/" + it->second).has_commit) {
        oldest_committed = it->first;
        break;
      }
    }
  }
  for (const auto& [step, name] : steps) {
    if (step > newest) continue;  // may still be in progress
    std::string step_dir = dir + "/" + name;
    StepScan scan = ScanStep(step_dir);
    if (!scan.commit_problem.empty()) continue;
    bool in_progress = std::any_of(scan.saves.begin(), scan.saves.end(),
                                   [&](const SaveId& s) { return IsInProgress(s, committed); });
    bool keep = scan.has_commit && kept < std::max(keep_last, 1);
    if (keep) ++kept;
    // The newest verified one stays too, so that a rollback after a late
    // verdict (a divergence, a NaN) still has good state to resume from.
    if (scan.has_commit && verified >= 0 && step <= verified && !verified_kept) keep = verified_kept = true;
    // Nothing verified yet (a job's first minutes): the oldest committed step stays until something is.
    if (scan.has_commit && verified == -2 && step == oldest_committed) keep = true;
    if (!keep && !in_progress) {
      Status s = RetireStep(dir, name);
      if (!s.ok()) problems.push_back(s.message());
      continue;
    }
    for (const SaveId& save : scan.saves) {
      if (!IsDebris(save, scan, committed)) continue;
      std::error_code rm;
      fs::remove_all(step_dir + "/" + save.DirName(), rm);
      if (rm) problems.push_back("cannot delete " + step_dir + "/" + save.DirName() + ": " + rm.message());
    }
  }
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
  return IoError("retention: " + all);
}

}  // namespace trainguard
