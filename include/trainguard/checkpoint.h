// Two-phase checkpointing: a fast snapshot into host memory (phase 1), then a
// background persist with checksums and an atomic multi-rank commit (phase 2).
// Format: docs/checkpoint_format.md.
//
// A checkpoint of step S lives in DIR/step-<S, 12 digits>/. Every save is
// identified (SaveRequest::attempt and ::sequence) and writes into a
// directory of its own, save-<attempt>-<sequence>/, where each rank writes a
// new data file and a manifest; rank 0 writes COMMIT.json, naming that save,
// once every rank's manifest of that same save is durable. Only the save that
// COMMIT.json names is visible; debris of other saves is never read, and a
// step is retired by renaming it away before its files are deleted.
//
// Ranks that hold identical state form a replica group (DDP: all ranks). The
// group's state is laid out as one byte stream; member i of R persists bytes
// [i*chunk, (i+1)*chunk) of it, so the group writes its state once in total,
// each member about 1/R of it, and a restore reads it once and exchanges it.
//
// Thread safety: CheckpointEngine's methods may be called from any thread; one
// background thread persists. Save() never waits for the disk, except when a
// previous save is still being persisted and the overflow policy is kBlock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

// One tensor (or any buffer) of the state. `data` must stay valid and
// unmodified until Save() returns.
struct TensorRef {
  std::string name;               // unique within the state
  std::string dtype;              // free-form, e.g. "float32", "bfloat16"; stored as is
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::uint64_t nbytes = 0;
  bool on_device = false;         // CUDA memory: needs a build with CUDA and a GPU
};

struct SaveRequest {
  std::int64_t step = 0;
  std::vector<TensorRef> tensors;
  std::string blob;               // opaque bytes for non-tensor state (e.g. a pickle)
  int rank = 0;
  int world_size = 1;
  // The ranks holding the same state as this one, in order, including `rank`.
  // Empty means {rank} (no deduplication).
  std::vector<int> replica_group;
  // For on_device tensors: the CUDA stream (a cudaStream_t) on which the
  // work that produces them was queued. The snapshot's copies wait for the
  // work queued on it before Save() was called, and for nothing else.
  // nullptr: the legacy default stream.
  void* device_stream = nullptr;
  // Which save this is. `attempt` names this run of the job: every rank passes
  // the same value, and each restart of the job a new one (e.g. a random nonce
  // that rank 0 draws and broadcasts). `sequence` counts the saves of this
  // attempt: the same on every rank for one save, larger for each later save.
  // Together they must never repeat within a directory; a commit binds only
  // the parts of exactly this save. 1-64 characters of [A-Za-z0-9_].
  // An empty attempt is allowed only for world_size 1: the engine then uses a
  // nonce of its own and counts the sequence itself.
  std::string attempt;
  std::int64_t sequence = 0;
  // The memory tier (docs/checkpoint_format.md, "Saves to memory alone"):
  // data and manifest go to the node's memory copies only, never to `dir`.
  // Such a save counts once every rank has it: the caller agrees on that
  // with the other ranks (SettleMemory, then CommitMemory on every rank).
  // Needs CheckpointOptions::memory_dir.
  bool memory_only = false;
};

enum class OverflowPolicy {
  kBlock,  // Save() waits until the previous save is persisted (counted as blocked)
  kSkip,   // Save() returns at once and the new checkpoint is not taken (counted as skipped)
};

struct CheckpointOptions {
  std::string dir;
  int keep_last = 3;              // complete checkpoints kept (the newest is never deleted)
  int copy_threads = 4;           // phase 1 memcpy threads for large states
  int writer_threads = 4;         // phase 2 parallel pwrite + checksum
  OverflowPolicy overflow = OverflowPolicy::kBlock;
  double commit_timeout_s = 600;  // a step whose ranks are not all durable by then is abandoned
  bool report_to_trainguard = true;  // tell the agent (client::CheckpointCommitted) on commit
  // Node memory copies (docs/restart.md): each save's data file is also
  // written to MEMORY_DIR/step-N/SAVE/rank-R.data (a tmpfs the agent owns,
  // which outlives the rank); the newest `memory_keep` committed steps are
  // kept there (one more once saves to memory alone were committed). "" = none.
  std::string memory_dir;
  int memory_keep = 1;
};

struct CheckpointStats {
  std::int64_t saves = 0;
  std::int64_t skipped = 0;          // kSkip: saves dropped because one was in flight
  std::int64_t blocked = 0;          // kBlock: saves that had to wait for the previous one
  std::int64_t failed = 0;           // phase 2 errors (disk full, I/O error, ...)
  std::int64_t abandoned = 0;        // steps that never got all ranks' manifests
  std::int64_t last_committed_step = -1;
  std::uint64_t bytes_written = 0;   // by this rank
  double last_snapshot_s = 0;        // phase 1 duration of the latest save
  double last_persist_s = 0;         // phase 2 duration (write + fsync) of the latest save
  double last_blocked_s = 0;         // time Save() waited for a previous save
  double last_memory_persist_s = 0;  // the latest save to memory alone: its write into the node's memory
  std::int64_t memory_commits = 0;   // saves to memory alone that every rank had
  std::string last_error;
};

// A save to memory alone whose write on this rank has finished.
struct MemorySave {
  std::int64_t step = 0;
  std::string attempt;
  std::int64_t sequence = 0;
  bool ok = false;                   // this rank's data and manifest are whole in memory
};

class CheckpointEngine {
 public:
  static StatusOr<std::unique_ptr<CheckpointEngine>> Create(const CheckpointOptions& options);
  virtual ~CheckpointEngine() = default;

  // Phase 1: copies this rank's part of the state into host memory and
  // queues phase 2. Returns once the copy is complete (the caller may modify
  // the tensors). Returns kFailedPrecondition if skipped (kSkip policy),
  // kInvalidArgument for a bad request, and the error of a previous
  // background failure is never returned here (see stats()).
  virtual Status Save(const SaveRequest& request) = 0;
  // Waits until every queued save is persisted and committed or abandoned.
  // Returns the first error since the previous Wait(), if any.
  virtual Status Wait() = 0;
  virtual CheckpointStats stats() const = 0;
  // Waits for a save to memory alone still being written; returns the saves
  // to memory alone written (or failed) since the last call, oldest first.
  virtual std::vector<MemorySave> SettleMemory() = 0;
  // Every rank calls this for each settled save, with `everywhere` = whether
  // every rank's `ok` was true. Then it writes its commit marker (the save
  // is restorable from memory) and reports the step as committed; otherwise
  // it removes its files of that save.
  virtual Status CommitMemory(const MemorySave& save, bool everywhere) = 0;
};

// ---- Reading ------------------------------------------------------------

struct TensorLayout {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;       // in the group's stream, 64-byte aligned
  std::uint64_t nbytes = 0;
};

// One rank's manifest (rank-<R>.json), parsed.
struct RankManifest {
  std::int64_t step = 0;
  std::string attempt;            // the save it belongs to (SaveRequest)
  std::int64_t sequence = 0;
  int rank = 0;
  int world_size = 0;
  std::vector<int> replica_group;
  std::uint64_t total_bytes = 0;  // of the group's stream
  std::uint64_t blob_offset = 0;
  std::uint64_t blob_nbytes = 0;
  std::vector<TensorLayout> tensors;
  std::uint64_t lo = 0, hi = 0;   // the part of the stream this rank stored
};

struct CheckpointInfo {
  std::int64_t step = 0;
  std::string path;
  bool committed = false;         // a valid COMMIT.json names a save
  bool complete = false;          // committed, and every manifest it binds and every
                                  // data file of the right size present (checksums
                                  // are checked by VerifyCheckpoint, not here)
  std::string problem;            // why a committed step is not complete, or why its
                                  // COMMIT.json cannot be used (e.g. another format version)
  std::string save;               // the committed save's directory name ("" if none)
  int world_size = 0;             // from COMMIT.json (0 if uncommitted)
  int manifests = 0;              // manifests of the committed save, or of all saves if none
  std::uint64_t bytes = 0;        // data bytes of the committed save, or of all saves if none
};

// All step directories under `dir`, newest first. Steps being retired
// (renamed away) are not listed.
StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir);
// The manifest of `rank` in the save that the step's COMMIT.json names,
// checked against the checksum recorded there. kNotFound: not committed.
StatusOr<RankManifest> ReadManifest(const std::string& dir, std::int64_t step, int rank);
// Reads bytes [lo, hi) of the group stream that `manifest` describes (from
// ReadManifest) into `dest` (hi - lo bytes), verifying the checksum of every
// piece. Fails with kFailedPrecondition if the step's commit no longer names
// the manifest's save (re-saved meanwhile): a reader never mixes two saves.
// Corruption and missing files are kIoError / kNotFound with the file named.
Status ReadStoredRange(const std::string& dir, const RankManifest& manifest, void* dest,
                       std::uint64_t size, int threads = 4);
// The same, from the node's memory copy in `memory_dir` when it has one of
// exactly the committed save that verifies against the stored manifest's
// checksums; else from storage. `source` says which ("memory", "storage");
// `memory_problem` why a memory copy there was not used ("" if none was).
Status ReadStoredRange(const std::string& dir, const RankManifest& manifest, void* dest,
                       std::uint64_t size, int threads, const std::string& memory_dir,
                       std::string* source, std::string* memory_problem);
// The node's memory copy of a rank's committed range, mapped privately
// (copy-on-write: writes never reach the copy) and verified in place against
// the stored manifest's checksums: a restore without copying the bytes. The
// caller owns the mapping (munmap(data, size)). kNotFound: no copy of this
// save (message "" when the memory holds nothing of the step); any other
// error says why the copy there cannot be used.
struct MappedRange {
  void* data = nullptr;
  std::uint64_t size = 0;
  std::string origin;  // "" = this node's own copy; else the node whose memory it was fetched from
};
StatusOr<MappedRange> MapMemoryCopy(const std::string& dir, const RankManifest& manifest,
                                    const std::string& memory_dir, int threads = 4);
// Saves to memory alone (SaveRequest::memory_only) that `rank` committed in
// the node's memory at `memory_dir` (its own, or fetched from a peer):
// newest first. Only the commit markers are read.
struct MemorySaveInfo {
  std::int64_t step = 0;
  std::string attempt;
  std::int64_t sequence = 0;
  std::int64_t created_unix_ms = 0;  // when committed: of two saves of a step, the later comes first
};
std::vector<MemorySaveInfo> ListMemorySaves(const std::string& memory_dir, int rank);
// One of them: its commit read, the manifest checked against the commit's
// checksum, the data mapped privately and verified in place. Errors say
// which file is missing or wrong.
struct MemoryRestore {
  RankManifest manifest;
  MappedRange range;
};
StatusOr<MemoryRestore> MapMemorySave(const std::string& memory_dir, std::int64_t step, int rank,
                                      const std::string& attempt, std::int64_t sequence, int threads = 4);
// Checks a step: committed, every rank's manifest of the committed save and
// its data present, every checksum right. Returns OK or the list of problems
// (one per line).
Status VerifyCheckpoint(const std::string& dir, std::int64_t step);

}  // namespace trainguard
