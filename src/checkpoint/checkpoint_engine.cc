#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "trainguard/client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/commit.h"
#include "checkpoint/files.h"
#include "checkpoint/host_memory.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/parallel.h"
#include "common/clock.h"
#include "trainguard/checkpoint.h"
#include "trainguard/client.h"

namespace trainguard {

namespace fs = std::filesystem;

namespace {

double SecondsSince(Nanos start) {
  return static_cast<double>(MonotonicNowNanos() - start) / kSecond;
}

struct Job {
  std::int64_t step = 0;
  SaveId save;
  int rank = 0;
  int world_size = 1;
  std::vector<int> group;
  StreamLayout layout;
  std::uint64_t lo = 0, hi = 0;
  std::vector<Piece> pieces;
  bool memory_only = false;
};

// A save to memory alone this rank has written (or failed to), until the
// ranks' agreement commits or drops it.
struct MemoryWritten {
  MemorySave save;
  int rank = 0;
  int world_size = 1;
  std::uint64_t manifest_xxh3 = 0;
  bool settled = false;  // SettleMemory returned it
};

// A save this rank made durable whose commit it has not seen yet.
struct Pending {
  std::int64_t step;
  SaveId save;
  int rank;        // rank 0 is the committer
  int world_size;
  Nanos deadline;
};

class PosixCheckpointEngine final : public CheckpointEngine {
 public:
  PosixCheckpointEngine(CheckpointOptions options, std::unique_ptr<HostMemory> memory)
      : options_(std::move(options)), memory_(std::move(memory)), buffer_(memory_.get()) {
    own_attempt_ = RandomHex();
    thread_ = std::thread([this] { Loop(); });
  }

  ~PosixCheckpointEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }

  Status Save(const SaveRequest& req) override {
    TG_RETURN_IF_ERROR(Validate(req));
    Nanos entered = MonotonicNowNanos();
    std::vector<int> group = req.replica_group.empty() ? std::vector<int>{req.rank} : req.replica_group;
    int index = static_cast<int>(std::find(group.begin(), group.end(), req.rank) - group.begin());
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (busy_) {
        // A save to memory alone waits: every rank must have each one, for the ranks' agreement.
        if (options_.overflow == OverflowPolicy::kSkip && !req.memory_only) {
          ++stats_.skipped;
          std::fprintf(stderr,
                       "trainguard: checkpoint of step %lld skipped: the previous one is still "
                       "being persisted (%lld skipped so far)\n",
                       static_cast<long long>(req.step), static_cast<long long>(stats_.skipped));
          return FailedPrecondition("checkpoint of step " + std::to_string(req.step) +
                                    " skipped: the previous one is still being persisted");
        }
        ++stats_.blocked;
        Nanos t0 = MonotonicNowNanos();
        cv_.wait(lock, [&] { return !busy_; });
        stats_.last_blocked_s = SecondsSince(t0);
      } else {
        stats_.last_blocked_s = 0;
      }
      busy_ = true;  // the buffer is ours until the background thread is done with it
    }
    Nanos t0 = MonotonicNowNanos();
    Job job;
    job.step = req.step;
    job.save = req.attempt.empty() ? SaveId{own_attempt_, own_sequence_++}
                                   : SaveId{req.attempt, req.sequence};
    job.rank = req.rank;
    job.world_size = req.world_size;
    job.group = group;
    job.layout = ComputeLayout(req);
    std::tie(job.lo, job.hi) = MemberRange(job.layout.total_bytes, static_cast<int>(group.size()), index);
    job.pieces = PiecesIn(job.layout, job.lo, job.hi);
    job.memory_only = req.memory_only;
    Status s = Snapshot(req, job);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      busy_ = false;
      cv_.notify_all();
      return s;
    }
    stats_.last_snapshot_s = SecondsSince(t0);
    ++stats_.saves;
    if (options_.report_to_trainguard) {
      client::AddCheckpointOverhead(MonotonicNowNanos() - entered);
      client::AddCheckpointWait(static_cast<std::int64_t>(stats_.last_blocked_s * 1e9));
    }
    job_ = std::move(job);
    has_job_ = true;
    cv_.notify_all();
    return Status::Ok();
  }

  Status Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_ && pending_.empty(); });
    Status s = first_error_;
    first_error_ = Status::Ok();
    return s;
  }

  CheckpointStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  std::vector<MemorySave> SettleMemory() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    std::vector<MemorySave> out;
    for (const auto& w : memory_written_) out.push_back(w.save);
    for (auto& w : memory_written_) w.settled = true;
    return out;
  }

  Status CommitMemory(const MemorySave& ms, bool everywhere) override {
    const SaveId id{ms.attempt, ms.sequence};
    MemoryWritten written;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(memory_written_.begin(), memory_written_.end(), [&](const MemoryWritten& w) {
        return w.settled && w.save.step == ms.step && SaveId{w.save.attempt, w.save.sequence} == id;
      });
      if (it == memory_written_.end()) {
        return InvalidArgument("checkpoint: no save to memory alone of step " + std::to_string(ms.step) + " (" +
                               id.DirName() + ") was settled here");
      }
      written = *it;
      memory_written_.erase(it);
    }
    const std::string dir = MemorySaveDir(ms.step, id);
    const std::string stem = dir + "/" + RankFileStem(written.rank);
    if (!everywhere || !written.save.ok) {
      // Not every rank has it: it can never be restored; its files go.
      for (const char* ext : {".json", ".data"}) unlink((stem + ext).c_str());
      rmdir(dir.c_str());
      return Status::Ok();
    }
    MemoryCommitRecord c{ms.step, id, written.rank, written.world_size, written.manifest_xxh3,
                         WallNowNanos() / kMillisecond};
    Status s = WriteFileAtomic(stem + ".commit", EncodeMemoryCommit(c));
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      RecordError(s);
      for (const char* ext : {".json", ".data"}) unlink((stem + ext).c_str());
      return s;
    }
    ++stats_.memory_commits;
    stats_.last_committed_step = std::max(stats_.last_committed_step, ms.step);
    own_rank_ = written.rank;
    RetainMemory(ms.step);
    Report(ms.step);
    return Status::Ok();
  }

 private:
  Status Validate(const SaveRequest& req) {
    if (req.world_size < 1 || req.rank < 0 || req.rank >= req.world_size) {
      return InvalidArgument("checkpoint: rank " + std::to_string(req.rank) +
                             " is not within world size " + std::to_string(req.world_size));
    }
    if (req.step < 0) return InvalidArgument("checkpoint: step must not be negative");
    if (req.memory_only && options_.memory_dir.empty()) {
      return FailedPrecondition("checkpoint: a save to memory alone needs node memory copies "
                                "(the agent's TRAINGUARD_MEMORY_CHECKPOINTS; run --memory-checkpoints >= 1)");
    }
    if (req.attempt.empty() && req.world_size > 1) {
      return InvalidArgument("checkpoint: a save of " + std::to_string(req.world_size) +
                             " ranks needs an attempt identity that every rank agrees on");
    }
    if (!req.attempt.empty() && !IsValidAttempt(req.attempt)) {
      return InvalidArgument("checkpoint: attempt '" + req.attempt +
                             "' must be 1-64 characters of [A-Za-z0-9_]");
    }
    if (req.sequence < 0) return InvalidArgument("checkpoint: sequence must not be negative");
    if (!req.replica_group.empty()) {
      std::set<int> members(req.replica_group.begin(), req.replica_group.end());
      if (members.size() != req.replica_group.size() || !members.count(req.rank) ||
          *members.begin() < 0 || *members.rbegin() >= req.world_size) {
        return InvalidArgument("checkpoint: replica group must list distinct ranks of the job, "
                               "including rank " + std::to_string(req.rank));
      }
    }
    std::set<std::string> names;
    for (const auto& t : req.tensors) {
      if (t.name.empty()) return InvalidArgument("checkpoint: a tensor has an empty name");
      if (!names.insert(t.name).second) {
        return InvalidArgument("checkpoint: tensor name '" + t.name + "' appears twice");
      }
      if (t.nbytes > 0 && t.data == nullptr) {
        return InvalidArgument("checkpoint: tensor '" + t.name + "' has no data");
      }
    }
    return Status::Ok();
  }

  // Phase 1: copies this rank's pieces into the host buffer.
  Status Snapshot(const SaveRequest& req, const Job& job) {
    std::uint64_t size = job.hi - job.lo;
    TG_RETURN_IF_ERROR(buffer_.Reserve(std::max<std::uint64_t>(size, 1)));
    char* base = buffer_.data();
    // Split pieces into copy segments of at most 16 MiB for the thread pool.
    struct Segment {
      char* dst;
      const char* src;
      std::uint64_t len;
      bool device;
    };
    constexpr std::uint64_t kSegment = 16ULL << 20;
    std::vector<Segment> segments;
    std::uint64_t cursor = job.lo;
    for (const Piece& p : job.pieces) {
      if (p.offset > cursor) std::memset(base + (cursor - job.lo), 0, p.offset - cursor);  // padding
      const char* src;
      bool device = false;
      if (p.entry < 0) {
        src = req.blob.data() + (p.offset - job.layout.blob_offset);
      } else {
        const TensorRef& t = req.tensors[p.entry];
        src = static_cast<const char*>(t.data) + (p.offset - job.layout.tensors[p.entry].offset);
        device = t.on_device;
      }
      for (std::uint64_t o = 0; o < p.length; o += kSegment) {
        segments.push_back({base + (p.offset - job.lo) + o, src + o,
                            std::min(kSegment, p.length - o), device});
      }
      cursor = p.offset + p.length;
    }
    if (job.hi > cursor) std::memset(base + (cursor - job.lo), 0, job.hi - cursor);
    bool any_device = std::any_of(segments.begin(), segments.end(),
                                  [](const Segment& s) { return s.device; });
    if (any_device) TG_RETURN_IF_ERROR(memory_->WaitFor(req.device_stream));
    for (const auto& s : segments) {
      if (s.device) {
        Status st = memory_->CopyFromDevice(s.dst, s.src, s.len);
        if (!st.ok()) return st;
      }
    }
    int threads = size >= (64ULL << 20) ? options_.copy_threads : 1;
    ParallelFor(segments.size(), threads, [&](size_t i) {
      if (!segments[i].device) std::memcpy(segments[i].dst, segments[i].src, segments[i].len);
    });
    return memory_->Sync();
  }

  void Loop() {
    for (;;) {
      std::optional<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return has_job_ || stopping_; });
        if (has_job_) job = std::move(job_);
        if (!job && stopping_) return;
      }
      if (job) {
        MemoryWritten written;
        Status s = job->memory_only ? PersistToMemory(*job, &written) : Persist(*job);
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.ok()) RecordError(s);
        if (job->memory_only) {
          written.save = {job->step, job->save.attempt, job->save.sequence, s.ok()};
          written.rank = job->rank;
          written.world_size = job->world_size;
          memory_written_.push_back(written);
        }
        has_job_ = false;
        busy_ = false;
        cv_.notify_all();
      }
      PollCommits();
    }
  }

  void RecordError(const Status& s) {  // mu_ held
    ++stats_.failed;
    stats_.last_error = s.message();
    if (first_error_.ok()) first_error_ = s;
    std::fprintf(stderr, "trainguard: checkpoint failed: %s\n", s.message().c_str());
  }

  std::string StepDir(std::int64_t step) const { return options_.dir + "/" + StepDirName(step); }

  // Phase 2: into the save's own directory, new files only: the data file
  // (parallel pwrite + checksums, fsync), then the manifest (atomic rename).
  // Nothing another save wrote is touched.
  Status Persist(const Job& job) {
    Nanos t0 = MonotonicNowNanos();
    std::string step_dir = StepDir(job.step);
    std::string dir = step_dir + "/" + job.save.DirName();
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return IoError("cannot create checkpoint directory " + dir + ": " + ec.message());
    // The new directories' entries must be durable before the commit can name them.
    TG_RETURN_IF_ERROR(FsyncDir(options_.dir));
    TG_RETURN_IF_ERROR(FsyncDir(step_dir));
    std::string stem = RankFileStem(job.rank);
    std::string data_path = dir + "/" + stem + ".data";
    std::string manifest_path = dir + "/" + stem + ".json";
    auto fail = [&](Status s) {
      unlink(data_path.c_str());
      unlink(manifest_path.c_str());
      unlink((manifest_path + ".tmp").c_str());
      rmdir(dir.c_str());  // only if no other rank wrote into it
      return s;
    };
    std::uint64_t size = job.hi - job.lo;
    // O_EXCL: a save never truncates a file; an existing one means a reused save identity.
    int fd = open(data_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      bool reused = errno == EEXIST;  // read before anything else can change errno
      Status s = IoError(ErrnoMessage("create", data_path) +
                         (reused ? " (the save identity was used before)" : ""));
      return reused ? s : fail(s);  // a reused identity's files are not ours to delete
    }
    // Reserve the space first: a full disk is reported before any write.
    if (size > 0) {
      int rc = posix_fallocate(fd, 0, static_cast<off_t>(size));
      if (rc != 0) {
        close(fd);
        errno = rc;
        return fail(IoError(ErrnoMessage("reserve " + std::to_string(size) + " bytes for", data_path)));
      }
    }
    std::vector<StoredPiece> stored;
    Status write_error = WritePieces(job, fd, data_path, &stored);
    if (!write_error.ok()) {
      close(fd);
      return fail(write_error);
    }
    if (fsync(fd) != 0) {
      Status s = IoError(ErrnoMessage("fsync", data_path));
      close(fd);
      return fail(s);
    }
    close(fd);
    CopyToMemory(job, stem + ".data");

    Status s = WriteFileAtomic(manifest_path, EncodeManifest(MakeManifest(job, std::move(stored))));
    if (!s.ok()) return fail(s);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_written += size;
    stats_.last_persist_s = SecondsSince(t0);
    pending_.push_back({job.step, job.save, job.rank, job.world_size,
                        MonotonicNowNanos() + static_cast<Nanos>(options_.commit_timeout_s * kSecond)});
    return Status::Ok();
  }

  // The buffer's pieces into `fd` (parallel pwrite), with their checksums.
  Status WritePieces(const Job& job, int fd, const std::string& path, std::vector<StoredPiece>* stored) {
    const char* base = buffer_.data();
    stored->assign(job.pieces.size(), StoredPiece{});
    std::mutex err_mu;
    Status write_error;
    ParallelFor(job.pieces.size(), options_.writer_threads, [&](size_t i) {
      const Piece& p = job.pieces[i];
      const char* src = base + (p.offset - job.lo);
      (*stored)[i] = {p.offset, p.length, XXH3_64bits(src, p.length)};
      std::uint64_t done = 0;
      while (done < p.length) {
        ssize_t n = pwrite(fd, src + done, p.length - done, static_cast<off_t>(p.offset - job.lo + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          std::lock_guard<std::mutex> lock(err_mu);
          if (write_error.ok()) write_error = IoError(ErrnoMessage("write", path));
          return;
        }
        done += static_cast<std::uint64_t>(n);
      }
    });
    return write_error;
  }

  static ManifestFile MakeManifest(const Job& job, std::vector<StoredPiece> stored) {
    ManifestFile m;
    m.manifest.step = job.step;
    m.manifest.attempt = job.save.attempt;
    m.manifest.sequence = job.save.sequence;
    m.manifest.rank = job.rank;
    m.manifest.world_size = job.world_size;
    m.manifest.replica_group = job.group;
    m.manifest.total_bytes = job.layout.total_bytes;
    m.manifest.blob_offset = job.layout.blob_offset;
    m.manifest.blob_nbytes = job.layout.blob_nbytes;
    m.manifest.tensors = job.layout.tensors;
    m.manifest.lo = job.lo;
    m.manifest.hi = job.hi;
    m.data_file = RankFileStem(job.rank) + ".data";
    m.pieces = std::move(stored);
    return m;
  }

  std::string MemorySaveDir(std::int64_t step, const SaveId& save) const {
    return options_.memory_dir + "/" + StepDirName(step) + "/" + save.DirName();
  }

  // A save to memory alone (docs/checkpoint_format.md): the data file, then
  // the manifest, into the node's memory, each whole once named (NAME.tmp
  // renamed); nothing in `dir`. The caller's agreement commits it.
  Status PersistToMemory(const Job& job, MemoryWritten* written) {
    Nanos t0 = MonotonicNowNanos();
    const std::string dir = MemorySaveDir(job.step, job.save);
    const std::string stem = dir + "/" + RankFileStem(job.rank);
    const std::string data_path = stem + ".data", tmp = data_path + ".tmp";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return IoError("cannot create the node memory copy directory " + dir + ": " + ec.message());
    for (const char* ext : {".data.origin", ".json.origin", ".commit.origin", ".commit"}) unlink((stem + ext).c_str());
    auto fail = [&](Status s) {
      for (const std::string& f : {tmp, data_path, stem + ".json"}) unlink(f.c_str());
      rmdir(dir.c_str());
      return s;
    };
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return fail(IoError(ErrnoMessage("create", tmp)));
    const std::uint64_t size = job.hi - job.lo;
    // Reserved first: a full tmpfs is an error here, not a short write.
    if (int rc = size > 0 ? posix_fallocate(fd, 0, static_cast<off_t>(size)) : 0; rc != 0) {
      close(fd);
      errno = rc;
      return fail(IoError(ErrnoMessage("reserve " + std::to_string(size) + " bytes for", tmp)));
    }
    std::vector<StoredPiece> stored;
    Status s = WritePieces(job, fd, tmp, &stored);
    if (close(fd) != 0 && s.ok()) s = IoError(ErrnoMessage("close", tmp));
    if (!s.ok()) return fail(s);
    if (rename(tmp.c_str(), data_path.c_str()) != 0) return fail(IoError(ErrnoMessage("rename", tmp)));
    const std::string manifest = EncodeManifest(MakeManifest(job, std::move(stored)));
    s = WriteFileAtomic(stem + ".json", manifest);
    if (!s.ok()) return fail(s);
    written->manifest_xxh3 = XXH3_64bits(manifest.data(), manifest.size());
    std::lock_guard<std::mutex> lock(mu_);
    stats_.last_memory_persist_s = SecondsSince(t0);
    return Status::Ok();
  }

  void Report(std::int64_t step) {  // mu_ held
    if (!options_.report_to_trainguard || step <= reported_step_) return;
    reported_step_ = step;
    client::CheckpointCommitted(step);
  }

  // The node's memory copy of this rank's data (options_.memory_dir): the
  // same bytes, not fsynced (a tmpfs). A bonus: a failure is said once and
  // the save goes on; the reader uses a copy only if it verifies.
  void CopyToMemory(const Job& job, const std::string& data_file) {
    if (options_.memory_dir.empty()) return;
    std::string dir = options_.memory_dir + "/" + StepDirName(job.step) + "/" + job.save.DirName();
    std::string path = dir + "/" + data_file;
    std::string tmp = path + ".tmp";  // whole once named: the agent pushes named copies to a peer
    std::error_code ec;
    fs::create_directories(dir, ec);
    unlink((path + ".origin").c_str());  // a copy fetched from a peer is replaced by this node's own
    int fd = ec ? -1 : open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0;
    const char* src = buffer_.data();
    for (std::uint64_t done = 0, size = job.hi - job.lo; ok && done < size;) {
      ssize_t n = write(fd, src + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<std::uint64_t>(n);
    }
    if (fd >= 0) ok = close(fd) == 0 && ok;
    if (ok) ok = rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) {
      unlink(tmp.c_str());
      if (!memory_warned_) {
        memory_warned_ = true;
        std::fprintf(stderr, "trainguard: checkpoint of step %lld has no copy in the node's memory: %s\n",
                     static_cast<long long>(job.step), ErrnoMessage("write", path).c_str());
      }
    }
  }

  // After a commit: this rank's memory copies of all but the newest
  // memory_keep committed steps go (an uncommitted save's copy is kept until
  // a newer commit: it may be the one that commits). With saves to memory
  // alone, one more: the peer's copy of another node's ranks may lag a
  // commit behind (its agent pushes after the commit), and a restore needs
  // the same step on every rank.
  void RetainMemory(std::int64_t committed_step) {
    if (options_.memory_dir.empty()) return;
    memory_committed_.insert(committed_step);
    const int keep = std::max(options_.memory_keep, 1) + (stats_.memory_commits > 0 ? 1 : 0);
    while (static_cast<int>(memory_committed_.size()) > keep) {
      memory_committed_.erase(memory_committed_.begin());
    }
    std::int64_t oldest_kept = *memory_committed_.begin();
    std::error_code ec;
    const std::string own = RankFileStem(own_rank_), stem = own + ".data";
    for (const auto& step_entry : fs::directory_iterator(options_.memory_dir, ec)) {
      long long step = -1;
      if (std::sscanf(step_entry.path().filename().c_str(), "step-%lld", &step) != 1 || step >= oldest_kept ||
          memory_committed_.count(step)) {
        continue;
      }
      std::error_code ec2;
      for (const auto& save_entry : fs::directory_iterator(step_entry.path(), ec2)) {
        // A save to memory alone has its manifest and commit there too; a
        // copy fetched from a peer has NAME.origin (docs/restart.md).
        for (const std::string& name : {stem, own + ".json", own + ".commit"}) {
          unlink((save_entry.path() / name).c_str());
          unlink((save_entry.path() / (name + ".origin")).c_str());
        }
        rmdir(save_entry.path().c_str());  // when no other rank's copy is left
      }
      rmdir(step_entry.path().c_str());
    }
  }

  // Rank 0 commits a save once every rank's manifest of that save is there;
  // every rank learns of the commit from COMMIT.json naming its save.
  void PollCommits() {
    std::vector<Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending = pending_;
    }
    for (const Pending& p : pending) {
      std::string step_dir = StepDir(p.step);
      auto commit = LoadCommit(step_dir);
      bool committed = commit.ok() && commit->save == p.save;
      bool superseded = false;
      Status error;
      if (!committed && p.rank == 0) {
        auto result = CommitIfComplete(step_dir, p.step, p.save, p.world_size,
                                       WallNowNanos() / kMillisecond);
        if (!result.ok()) {
          error = result.status();
        } else {
          committed = *result == CommitResult::kCommitted;
          superseded = *result == CommitResult::kSuperseded;
        }
      }
      if (committed && p.rank == 0) {  // before Wait() can return
        Status s = Retain(options_.dir, p.step, p.save, options_.keep_last, client::VerifiedStep());
        if (!s.ok()) std::fprintf(stderr, "trainguard: checkpoint %s\n", s.message().c_str());
      }
      // Gone: rank 0 committed and already retired it, or removed it as debris.
      bool gone = !committed && !fs::exists(step_dir + "/" + p.save.DirName());
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = std::find_if(pending_.begin(), pending_.end(),
                               [&](const Pending& q) { return q.save == p.save; });
        if (!error.ok()) {
          RecordError(error);
          pending_.erase(it);
        } else if (committed) {
          pending_.erase(it);
          stats_.last_committed_step = std::max(stats_.last_committed_step, p.step);
          own_rank_ = p.rank;
          RetainMemory(p.step);
          Report(p.step);
        } else if (superseded || gone) {
          pending_.erase(it);
        } else if (MonotonicNowNanos() > p.deadline) {
          pending_.erase(it);
          ++stats_.abandoned;
          std::fprintf(stderr,
                       "trainguard: checkpoint of step %lld abandoned: not every rank made it "
                       "durable within %.0f s\n",
                       static_cast<long long>(p.step), options_.commit_timeout_s);
        }
        cv_.notify_all();
      }
    }
  }

  const CheckpointOptions options_;
  bool memory_warned_ = false;             // a node memory copy failed once (said once)
  std::vector<MemoryWritten> memory_written_;  // saves to memory alone not yet committed or dropped
  std::int64_t reported_step_ = -1;        // the newest step reported committed (never goes back)
  std::set<std::int64_t> memory_committed_;  // committed steps whose memory copies are kept
  int own_rank_ = 0;
  std::unique_ptr<HostMemory> memory_;
  HostBuffer buffer_;  // owned by Save() while !busy_, by the background thread while busy_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;      // a snapshot is being taken or persisted
  bool has_job_ = false;
  bool stopping_ = false;
  Job job_;
  std::string own_attempt_;            // for requests without an attempt (world size 1)
  std::int64_t own_sequence_ = 0;      // guarded by busy_ (only Save() with the buffer uses it)
  std::vector<Pending> pending_;
  CheckpointStats stats_;
  Status first_error_;
  std::thread thread_;
};

}  // namespace

StatusOr<std::unique_ptr<CheckpointEngine>> CheckpointEngine::Create(const CheckpointOptions& options) {
  if (options.dir.empty()) return InvalidArgument("checkpoint: no directory given");
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return IoError("checkpoint: cannot create " + options.dir + ": " + ec.message());
  if (access(options.dir.c_str(), W_OK) != 0) {
    return IoError("checkpoint: directory " + options.dir + " is not writable");
  }
  if (options.keep_last < 1) return InvalidArgument("checkpoint: keep_last must be at least 1");
  return std::unique_ptr<CheckpointEngine>(
      new PosixCheckpointEngine(options, MakeHostMemory()));
}

}  // namespace trainguard
