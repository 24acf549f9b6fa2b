// The per-rank status page: a 32 KiB shared-memory file the agent creates and
// each training process (the client) updates. Spec: docs/status_page.md.
//
// Ownership: the agent creates, initializes and deletes the file; the client
// maps it read-write and is the only writer of the fields below `pid`; the
// agent only reads them. Every field is a lock-free 64-bit atomic, so the
// agent can read the page of a rank that is hung or dead. The phase name is
// guarded by a sequence counter (odd while being written).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdint>
#include <string>
#include <vector>

#include "common/op_journal.h"
#include "common/timing_ring.h"
#include "trainguard/status.h"

namespace trainguard {

constexpr std::uint64_t kStatusPageMagic = 0x5355544154534754ULL;  // "TGSTATUS" little-endian
constexpr std::uint32_t kStatusPageVersion = 3;
constexpr std::size_t kStatusPageSize = 32768;
constexpr std::size_t kJournalOffset = 4096;
constexpr std::size_t kTimingsOffset = 22528;
constexpr std::size_t kPhaseNameCapacity = 64;  // including the terminating NUL
constexpr std::int64_t kNoStep = -1;
constexpr int kFingerprints = 16;  // the ring of parameter fingerprints

// A numeric sentinel's anomaly (python/trainguard/_numeric.py).
enum NumericKind : int {
  kLossNonFinite = 1,
  kGradNormNonFinite = 2,
  kLossSpike = 3,
  kGradNormSpike = 4,
};

// Start-up marks of a rank, in the order a start passes them.
enum StartupMark : int {
  kMarkScriptStart = 0,   // the interpreter is up and the script begins (a warm standby: activated)
  kMarkPgInitBegin = 1,   // init_process_group called (the first time)
  kMarkPgInitEnd = 2,     // init_process_group returned (the last time before the first step)
  kMarkRestoreBegin = 3,  // a checkpoint load began (the first)
  kMarkRestoreEnd = 4,    // a checkpoint load ended (the last before the first step)
  kStartupMarks = 6,      // slots (two spare)
};

struct StatusPage {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t size;
  std::atomic<std::int64_t> pid;                 // 0 until the client attaches
  std::atomic<std::int64_t> attach_mono_ns;      // CLOCK_MONOTONIC at client init()
  std::atomic<std::int64_t> step;                // kNoStep until the first step()
  std::atomic<std::int64_t> step_count;          // number of step() calls
  std::atomic<std::int64_t> last_step_mono_ns;   // time of the latest step()
  std::atomic<std::int64_t> first_step_mono_ns;  // time of the first step(), 0 if none
  std::atomic<std::int64_t> checkpoint_step;     // newest committed checkpoint, kNoStep if none
  std::atomic<std::int64_t> checkpoint_mono_ns;
  std::atomic<std::uint64_t> phase_seq;          // seqlock over phase_name
  std::atomic<std::int64_t> phase_mono_ns;       // when the current phase began
  char phase_name[kPhaseNameCapacity];
  // Total time the training loop was blocked in checkpoint saves. Added in
  // place of padding: agents that predate it read 0, so version stays 1.
  std::atomic<std::int64_t> checkpoint_blocked_ns;
  // The longest time between two consecutive step() calls (version 2).
  std::atomic<std::int64_t> max_step_ns;
  // Start-up marks (CLOCK_MONOTONIC, 0 = not reached), set before the first
  // step only: where a (re)start's time went. Indexed by StartupMark.
  std::atomic<std::int64_t> startup_mono_ns[kStartupMarks];
  // The step of the checkpoint this process resumed from (kNoStep: none
  // reported), so that lost work is counted from what the ranks really loaded.
  std::atomic<std::int64_t> resumed_step;
  // The newest fingerprints of the rank's parameters (docs/sdc.md), a ring:
  // entry i % kFingerprints holds the i-th (count written so far), each the
  // optimizer step it was taken after and its value; under a seqlock (odd
  // while written).
  std::atomic<std::uint64_t> fingerprint_seq;
  std::atomic<std::uint64_t> fingerprint_count;
  struct FingerprintEntry {
    std::atomic<std::int64_t> step;
    std::atomic<std::uint64_t> value;
  } fingerprints[kFingerprints];
  // Numeric sentinels (docs/sdc.md): the process's first NaN/Inf, written
  // once (kind and value first, then the step with release; kNoStep: none),
  // and how many losses it has checked.
  std::atomic<std::int64_t> numeric_step;
  std::atomic<std::int64_t> numeric_kind;   // NumericKind
  std::atomic<std::uint64_t> numeric_value;  // the value's double bits
  std::atomic<std::int64_t> losses_observed;
  // The first spike (kind 3 or 4), written the same way.
  std::atomic<std::int64_t> spike_step;
  std::atomic<std::int64_t> spike_kind;
  std::atomic<std::uint64_t> spike_value;
  // Written by the agent, read by the client: the newest step the controller
  // verified (replicas agreed, no NaN through it; docs/sdc.md), kNoStep:
  // none. Checkpoint retention keeps the newest checkpoint at or before it.
  std::atomic<std::int64_t> verified_step;
  // Of checkpoint_blocked_ns, the time saves waited for the previous save's
  // phase 2 (its write to storage) to finish: storage slower than the
  // checkpoint interval.
  std::atomic<std::int64_t> checkpoint_waited_ns;
  // Files the rank's Python code opened (the interpreter's "open" audit
  // event: open(), os.open(), io.open_code() of imports), its forked data
  // loader workers' included: the rank's metadata rate.
  std::atomic<std::int64_t> files_opened;
  // The number of this process's first training step, kNoStep until it is
  // settled: the script's own when it reports steps (trainguard.step), else
  // the automatic count's once a second step confirms it. Stored with release
  // after first_step_mono_ns (docs/status_page.md).
  std::atomic<std::int64_t> first_step;
  // Written by the agent, read by the client: the controller's checkpoint
  // plan (docs/checkpoint_policy.md), the interval between saves to node
  // memory and to storage in milliseconds; 0: no plan (yet). Each is one
  // atomic: a reader may see one interval of an older plan beside the
  // other's newer one, and takes each as it reads it.
  std::atomic<std::int64_t> plan_memory_interval_ms;
  std::atomic<std::int64_t> plan_storage_interval_ms;
  // Saves whose blocking time was added to checkpoint_blocked_ns (one a
  // save: trainguard's checkpointer, or a script's add_checkpoint_overhead):
  // with it, the controller measures what a save costs.
  std::atomic<std::int64_t> checkpoint_saves;
  char reserved[kJournalOffset - 176 - 8 * kStartupMarks - 8 - 16 - 16 * kFingerprints - 112];
  OpJournal journal;  // version 2: the journal of communication operations
  char reserved_after_journal[kTimingsOffset - kJournalOffset - sizeof(OpJournal)];
  TimingRing timings;  // version 3: phase and step intervals, a ring
};
static_assert(offsetof(StatusPage, checkpoint_blocked_ns) == 160);
static_assert(offsetof(StatusPage, startup_mono_ns) == 176);
static_assert(offsetof(StatusPage, fingerprint_seq) == 232);
static_assert(offsetof(StatusPage, numeric_step) == 504);
static_assert(offsetof(StatusPage, verified_step) == 560);
static_assert(offsetof(StatusPage, checkpoint_waited_ns) == 568);
static_assert(offsetof(StatusPage, files_opened) == 576);
static_assert(offsetof(StatusPage, first_step) == 584);
static_assert(offsetof(StatusPage, plan_memory_interval_ms) == 592);
static_assert(offsetof(StatusPage, plan_storage_interval_ms) == 600);
static_assert(offsetof(StatusPage, checkpoint_saves) == 608);
static_assert(offsetof(StatusPage, journal) == kJournalOffset);
static_assert(offsetof(StatusPage, timings) == kTimingsOffset);
static_assert(sizeof(StatusPage) <= kStatusPageSize);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

// The file name of a rank's page: trainguard-JOB-NODE-AGENTPID-rRANK. The
// agent's pid keeps two jobs of the same id on one host apart, and tells a
// page whose agent is gone (killed before it could remove it).
std::string StatusPageName(const std::string& job, const std::string& node, long agent_pid, int rank);
// The agent pid in such a name; 0 if `name` is not one.
long StatusPageAgent(const std::string& name);
// Removes the page file at `path` if nothing holds it: the process that
// created it (MappedStatusPage::Create holds a lock while the page lives) is
// gone. Returns whether it removed it.
bool RemoveIfStale(const std::string& path);
// RemoveIfStale on every page in `dir` whose name starts with `prefix` and
// that was last written `min_age_s` or more ago (a page being made is not
// locked yet for an instant: a sweep over other agents' pages waits);
// returns how many went.
int RemoveStalePages(const std::string& dir, const std::string& prefix, int min_age_s = 0);

// Writes a fresh, empty page into `page` (agent side, before the rank starts).
void InitStatusPage(StatusPage* page);

// A consistent copy of a page, as the agent sees it.
struct StatusSnapshot {
  bool attached = false;
  std::int64_t pid = 0;
  std::int64_t attach_mono_ns = 0;
  std::int64_t step = kNoStep;
  std::int64_t step_count = 0;
  std::int64_t last_step_mono_ns = 0;
  std::int64_t first_step_mono_ns = 0;
  std::int64_t first_step = kNoStep;  // settled, else kNoStep
  std::int64_t checkpoint_step = kNoStep;
  std::int64_t phase_mono_ns = 0;
  std::int64_t checkpoint_blocked_ns = 0;
  std::int64_t checkpoint_waited_ns = 0;
  std::int64_t checkpoint_saves = 0;
  std::int64_t files_opened = 0;
  std::int64_t max_step_ns = 0;
  std::int64_t startup_mono_ns[kStartupMarks] = {};
  std::int64_t resumed_step = kNoStep;
  // The ring's fingerprints, oldest first: (step, value).
  std::vector<std::pair<std::int64_t, std::uint64_t>> fingerprints;
  std::int64_t numeric_step = kNoStep;  // the first numeric anomaly, kNoStep: none
  std::int64_t numeric_kind = 0;
  double numeric_value = 0;
  std::int64_t losses_observed = 0;
  std::int64_t spike_step = kNoStep;  // the first spike, kNoStep: none
  std::int64_t spike_kind = 0;
  double spike_value = 0;
  std::string phase;
};

StatusSnapshot ReadStatusPage(const StatusPage& page);

// Writes the phase name under the sequence lock (client side). The timing of
// the phase it ends is the client's (client.cc), not this function's.
void WritePhase(StatusPage* page, const char* name, std::int64_t now_mono_ns);

// A mapped status page file; unmaps on destruction. Not thread-safe itself;
// the page it points to is shared as described above.
class MappedStatusPage {
 public:
  MappedStatusPage() = default;
  ~MappedStatusPage();
  MappedStatusPage(MappedStatusPage&& other) noexcept;
  MappedStatusPage& operator=(MappedStatusPage&& other) noexcept;
  MappedStatusPage(const MappedStatusPage&) = delete;
  MappedStatusPage& operator=(const MappedStatusPage&) = delete;

  // Creates (or truncates) the file at `path` and initializes an empty page.
  static StatusOr<MappedStatusPage> Create(const std::string& path);
  // Maps an existing page; checks magic and version.
  static StatusOr<MappedStatusPage> Open(const std::string& path);

  StatusPage* get() const { return page_; }
  const std::string& path() const { return path_; }

 private:
  StatusPage* page_ = nullptr;
  std::string path_;
  int lock_fd_ = -1;  // Create's: a shared flock held while the page is in use
};

}  // namespace trainguard
