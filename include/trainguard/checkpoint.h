// Two-phase checkpointing: a fast snapshot into host memory (phase 1), then a
// background persist with checksums and an atomic multi-rank commit (phase 2).
// Format: docs/checkpoint_format.md.
//
// A checkpoint of step S lives in DIR/step-<S, 12 digits>/. Each rank writes a
// data file and a manifest; rank 0 writes COMMIT.json once every rank's
// manifest is durable. Only checkpoints with COMMIT.json are visible.
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
  std::string last_error;
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
  bool committed = false;         // COMMIT.json present
  int world_size = 0;             // from COMMIT.json (0 if uncommitted)
  int manifests = 0;              // rank manifests present
  std::uint64_t bytes = 0;        // data bytes on disk
};

// All step directories under `dir`, newest first.
StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir);
StatusOr<RankManifest> ReadManifest(const std::string& dir, std::int64_t step, int rank);
// Reads bytes [lo, hi) of the group stream that `rank` stored into `dest`
// (hi - lo bytes), verifying the checksum of every piece. Corruption and
// missing files are kIoError / kNotFound with the file named.
Status ReadStoredRange(const std::string& dir, std::int64_t step, int rank, void* dest,
                       std::uint64_t size, int threads = 4);
// Checks a step: committed, every rank's manifest and data present, every
// checksum right. Returns OK or the list of problems (one per line).
Status VerifyCheckpoint(const std::string& dir, std::int64_t step);

}  // namespace trainguard
