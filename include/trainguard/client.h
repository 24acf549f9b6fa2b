// The trainguard client: what a training process links to report progress.
//
// Every call is cheap and never blocks: it writes a few atomics into this
// rank's shared-memory status page (docs/status_page.md), which the node agent
// reads on its own schedule. Without an agent (TRAINGUARD_STATUS_PAGE unset)
// every call is a no-op. Nothing here allocates after Init(), and nothing
// here can crash the training process: a bad page makes Init() return false.
// Thread safety: all functions may be called from any thread; Step() from
// several threads at once leaves the page with one of the values written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainguard::client {

// Environment variable naming the status page file the agent created.
inline constexpr const char* kStatusPageEnv = "TRAINGUARD_STATUS_PAGE";

// Maps the status page. Returns true if attached to an agent, false if this
// process runs without one (or the page is unusable; a warning goes to stderr).
// Idempotent.
bool Init();
bool Attached();

// Records that the training loop finished step `step` (any non-decreasing
// counter the user chooses; the agent watches it advance).
void Step(std::int64_t step);

// A step counted by trainguard's automatic instrumentation (an optimizer step
// of a script that does not call Step). Once the script calls Step, these are
// ignored, and the step that call reports replaces the one just counted.
void AutomaticStep(std::int64_t step);

// Names the phase the loop is in now ("forward", "allreduce", "checkpoint",
// ...); at most 63 bytes are kept. Pass "" for none. Phases are timed: the
// interval a phase ran (ended by the next SetPhase, and split at each Step)
// goes into the status page's timing ring with the step it belongs to, and
// each Step adds the step's own duration. Phases do not nest: a phase set
// inside another pauses it, so durations are exclusive (they add up to at
// most the step's time); names are kept to 23 bytes, 48 names per process.
void SetPhase(const char* name);

// The last step reported (Step's argument), -1 before the first.
std::int64_t LastStep();

// Records device time of phase `name` measured elsewhere (CUDA events):
// `start_mono_ns` is when its start was recorded on the CPU, `after_step`
// the LastStep() of then.
void RecordDeviceTime(const char* name, std::int64_t start_mono_ns, std::int64_t duration_ns,
                      std::int64_t after_step);

// Records that a checkpoint of step `step` is durable; the controller uses it
// to count lost work after a failure.
void CheckpointCommitted(std::int64_t step);

// Start-up marks (common/status_page.h StartupMark): where a (re)start's time
// went. Ignored after the first Step(). kMarkPgInitEnd and kMarkRestoreEnd
// keep the latest call, the others the first.
void MarkStartup(int mark);

// Records that this process restored the checkpoint of `step`: the
// controller counts the lost work of the failure before from it.
void ResumedFrom(std::int64_t step);

// Records the fingerprint of this rank's parameters after optimizer step
// `step` (docs/sdc.md): the controller compares it with the rank's replicas'.
void ReportFingerprint(std::int64_t step, std::uint64_t fingerprint);

// Numeric sentinels (docs/sdc.md): the process's first anomaly at `step`
// (kind: 1 loss NaN/Inf, 2 gradient norm NaN/Inf, 3 loss spike, 4 gradient
// norm spike) and its value; later calls are ignored. NumericObserved counts
// one loss checked.
void ReportNumeric(std::int64_t step, int kind, double value);
void NumericObserved();

// The newest step the controller verified (docs/sdc.md): checkpoint
// retention keeps the newest checkpoint at or before it. -2: under
// trainguard, nothing verified yet; -1: not under trainguard.
std::int64_t VerifiedStep();

// The controller's checkpoint plan as the agent wrote it to the page
// (docs/checkpoint_policy.md): milliseconds between saves to node memory
// and to storage. Both 0 with no plan yet or not under trainguard.
void CheckpointPlanMs(std::int64_t* memory_ms, std::int64_t* storage_ms);

// Adds time the training loop spent blocked in a checkpoint save, once per
// save (the page counts the calls as saves); the controller counts it as
// checkpoint overhead and measures a save's cost from it (trainguard's own
// checkpointer calls this itself).
void AddCheckpointOverhead(std::int64_t nanos);
// Of that time, how long a save waited for the previous save's write to
// storage (its phase 2) to finish: the downtime report names storage from it.
void AddCheckpointWait(std::int64_t nanos);

// Counts a file the process opened (the agent reports the rank's metadata
// rate from it). The Python module calls it from the interpreter's "open"
// audit event.
void FileOpened();

// The journal of communication operations (docs/status_page.md). Python's
// automatic instrumentation calls these for every collective and
// point-to-point operation, DDP's gradient buckets included.
//
// Registers process group `id` (the same id on every rank) with its members'
// global ranks; returns a slot for JournalIssue, or -1 (not attached, or the
// table is full).
int JournalGroup(std::int32_t id, const std::string& name, const std::vector<std::int32_t>& members);
// Records an operation issued now: `op` and `dtype` are the journal's codes
// (OpKind, DtypeCode in common/op_journal.h); `peer` is the global rank of a
// send's or receive's peer, else -1; `on_device`: its tensors are on a GPU,
// and JournalStarted will say when the device reached it. Returns a token
// for JournalStarted and JournalComplete, or -1 if nothing was recorded.
std::int64_t JournalIssue(int group_slot, int op, int dtype, std::int64_t numel, std::int32_t peer,
                          bool on_device = false);
void JournalStarted(std::int64_t token);
void JournalComplete(std::int64_t token);

// Unmaps the page. Further calls are no-ops until Init() again.
void Shutdown();

}  // namespace trainguard::client
