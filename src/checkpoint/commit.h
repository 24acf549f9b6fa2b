// Every operation that changes which save of a step is visible: committing a
// save, retiring (deleting) a step, and removing the debris of saves that will
// never be committed. docs/checkpoint_format.md ("Crash consistency") argues
// why a crash between any two of their file operations leaves every step
// either one whole save or invisible.
//
// Functions over the file system only; no threads, no clock. Only one process
// (rank 0 of the job) calls the mutating ones for a directory at a time; a
// reader may run concurrently and sees each step before or after a change,
// never in between.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/manifest.h"
#include "trainguard/status.h"

namespace trainguard {

// The commit of the step directory `step_dir`, decoded. kNotFound if there is
// none; kInvalidArgument if it is damaged (then the step is not committed).
StatusOr<CommitRecord> LoadCommit(const std::string& step_dir);

// The manifest of `rank` in `save`, read from the save's directory. With
// `commit`, its checksum must be the one the commit records. The manifest must
// name this step, save and rank.
StatusOr<ManifestFile> LoadManifest(const std::string& step_dir, std::int64_t step,
                                    const SaveId& save, int rank, const CommitRecord* commit);

// What a step directory holds.
struct StepScan {
  bool has_commit = false;
  CommitRecord commit;            // valid if has_commit
  std::string commit_problem;     // COMMIT.json exists but cannot be used (e.g. another version)
  std::vector<SaveId> saves;      // every save directory, in no particular order
};
StepScan ScanStep(const std::string& step_dir);

enum class CommitResult {
  kCommitted,   // COMMIT.json now names `save` (by this call or an earlier one)
  kWaiting,     // some rank's manifest of `save` is not there yet
  kSuperseded,  // the step is committed to a later save of the same attempt; left alone
};

// Rank 0: once every rank's manifest of `save` is present and names this step
// and save, writes COMMIT.json atomically. A commit of another attempt's save
// is replaced (the newest save of a step wins; each is whole). Errors are
// kIoError with the path.
StatusOr<CommitResult> CommitIfComplete(const std::string& step_dir, std::int64_t step,
                                        const SaveId& save, int world_size,
                                        std::int64_t now_unix_ms);

// Makes the step directory `name` under `dir` invisible in one atomic rename
// (to .retiring-<name>-<nonce>, directory fsynced), then deletes it.
Status RetireStep(const std::string& dir, const std::string& name);

// After rank 0 committed `committed` (a save of step `newest`) in `dir`:
// - keeps the newest `keep_last` committed steps up to `newest`, and the
//   newest committed step at or before `verified` (>= 0: the controller
//   verified the state through it, docs/sdc.md; -2: nothing is verified
//   yet, the oldest committed step is kept instead; -1: no verification),
//   and retires the others;
// - in steps up to `newest`, removes the directories of saves that will never
//   be committed: saves of other attempts that no commit names, and earlier
//   saves of this attempt; a step left with no save and no commit is retired;
// - removes what interrupted retirements left behind.
// Steps newer than `newest`, and later saves of this attempt, may still be in
// progress and are left alone. Best effort: errors are returned after every
// step was tried; the caller reports them without failing the save.
Status Retain(const std::string& dir, std::int64_t newest, const SaveId& committed, int keep_last,
              std::int64_t verified = -1);

}  // namespace trainguard
