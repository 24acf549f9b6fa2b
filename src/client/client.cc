#include "trainguard/client.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "common/clock.h"
#include "common/status_page.h"
#include "trainguard/c_api.h"

namespace trainguard::client {
namespace {

std::mutex g_init_mu;                          // guards g_mapping
MappedStatusPage* g_mapping = nullptr;         // owned; leaked at exit on purpose
std::atomic<StatusPage*> g_page{nullptr};      // hot-path view of g_mapping
std::mutex g_journal_mu;                       // one journal writer at a time

// The phase being timed: the interval goes into the timing ring when the
// phase ends (SetPhase) or a step ends inside it (Step splits it there).
struct OpenPhase {
  bool open = false;
  int name = -1;                  // index in the ring's name table (-1: table full)
  std::int64_t start_mono_ns = 0;
  std::int64_t after_step = kNoStep;
  std::int64_t start_cpu_ns = -1;  // the process's CPU time when it began; -1: a phase not CPU-timed
};

// Compute phases are also timed in CPU time: what a rank computed, apart
// from how long the machine took to let it (the straggler detector's
// steadiest measure on CPU, docs/telemetry.md).
bool CpuTimed(const char* name) {
  return std::strcmp(name, "forward") == 0 || std::strcmp(name, "backward") == 0 ||
         std::strcmp(name, "optimizer") == 0;
}

std::int64_t ProcessCpuNanos() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
std::mutex g_timing_mu;  // one timing writer at a time; guards g_open and g_first
OpenPhase g_open;

// Settling the number of the process's first step. A script that reports its
// own steps does so after its optimizer steps, and the automatic count has by
// then reported that step under its own number (from 0, or after the step a
// recognised checkpoint load resumed from): the script's number wins, and the
// automatic count's first number stands only once a second automatic step
// shows that nobody else numbers them.
struct FirstStep {
  bool settled = false;
  bool explicit_steps = false;
  int automatic = 0;                    // automatic steps before settling
  std::int64_t candidate = kNoStep;     // the automatic count's first number
};
FirstStep g_first;

void Settle(StatusPage* page, std::int64_t first) {
  g_first.settled = true;
  page->first_step.store(first, std::memory_order_release);
}

// Ends the open phase at `now`, and at `cpu_now` of CPU time when it is
// CPU-timed (timing ring). Holds g_timing_mu.
void CloseOpenPhase(StatusPage* page, std::int64_t now, std::int64_t cpu_now) {
  if (!g_open.open) return;
  TimingAppend(&page->timings, g_open.name, TimingKind::kPhase, g_open.start_mono_ns,
               now - g_open.start_mono_ns, g_open.after_step, 0);
  if (g_open.start_cpu_ns >= 0 && cpu_now >= g_open.start_cpu_ns) {
    TimingAppend(&page->timings, g_open.name, TimingKind::kCpu, g_open.start_mono_ns,
                 cpu_now - g_open.start_cpu_ns, g_open.after_step, 0);
  }
  g_open.open = false;
}

}  // namespace

bool Init() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  if (g_page.load() != nullptr) return true;
  const char* path = std::getenv(kStatusPageEnv);
  if (path == nullptr || *path == '\0') return false;
  auto mapped = MappedStatusPage::Open(path);
  if (!mapped.ok()) {
    std::fprintf(stderr, "trainguard: not reporting progress: %s\n",
                 mapped.status().ToString().c_str());
    return false;
  }
  g_mapping = new MappedStatusPage(std::move(mapped.value()));
  StatusPage* page = g_mapping->get();
  page->attach_mono_ns.store(MonotonicNowNanos(), std::memory_order_relaxed);
  page->pid.store(getpid(), std::memory_order_release);
  g_page.store(page, std::memory_order_release);
  return true;
}

bool Attached() { return g_page.load(std::memory_order_acquire) != nullptr; }

namespace {

void RecordStep(std::int64_t step, bool automatic) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return;
  std::int64_t now = MonotonicNowNanos();
  std::lock_guard<std::mutex> lock(g_timing_mu);
  if (automatic && g_first.explicit_steps) return;  // the script numbers its steps
  if (!automatic && !g_first.explicit_steps) {
    g_first.explicit_steps = true;
    if (g_first.automatic > 0) {
      // This step's optimizer step was counted automatically a moment ago,
      // and so were the ones before it since the process began: the first
      // was this step's number less those.
      if (!g_first.settled) Settle(page, step - g_first.automatic + 1);
      page->step.store(step, std::memory_order_release);  // the same step, the script's number
      return;
    }
  }
  std::int64_t previous = page->last_step_mono_ns.load(std::memory_order_relaxed);
  if (previous == 0) previous = page->attach_mono_ns.load(std::memory_order_relaxed);
  std::int64_t after = page->step.load(std::memory_order_relaxed);
  bool reopen = g_open.open;
  OpenPhase phase = g_open;
  const std::int64_t cpu_now = g_open.open && g_open.start_cpu_ns >= 0 ? ProcessCpuNanos() : -1;
  CloseOpenPhase(page, now, cpu_now);
  TimingAppend(&page->timings, 0, TimingKind::kStep, previous, now - previous, after, step);
  if (reopen) {  // the phase goes on in the next step
    g_open = phase;
    g_open.start_mono_ns = now;
    g_open.after_step = step;
    if (g_open.start_cpu_ns >= 0) g_open.start_cpu_ns = cpu_now;
  }
  if (page->first_step_mono_ns.load(std::memory_order_relaxed) == 0) {
    page->first_step_mono_ns.store(now, std::memory_order_relaxed);
  } else {
    // The first step's time includes start-up; later ones are the loop's.
    std::int64_t took = now - page->last_step_mono_ns.load(std::memory_order_relaxed);
    if (took > page->max_step_ns.load(std::memory_order_relaxed)) {
      page->max_step_ns.store(took, std::memory_order_relaxed);
    }
  }
  page->last_step_mono_ns.store(now, std::memory_order_relaxed);
  page->step_count.fetch_add(1, std::memory_order_relaxed);
  page->step.store(step, std::memory_order_release);
  if (g_first.settled) return;
  if (!automatic) {
    Settle(page, step);
  } else if (g_first.automatic++ == 0) {
    g_first.candidate = step;
  } else {
    Settle(page, g_first.candidate);
  }
}

}  // namespace

void Step(std::int64_t step) { RecordStep(step, false); }

void AutomaticStep(std::int64_t step) { RecordStep(step, true); }

void SetPhase(const char* name) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return;
  if (name == nullptr) name = "";
  std::int64_t now = MonotonicNowNanos();
  std::lock_guard<std::mutex> lock(g_timing_mu);
  const bool cpu_timed = *name != '\0' && CpuTimed(name);
  const std::int64_t cpu_now = cpu_timed || (g_open.open && g_open.start_cpu_ns >= 0) ? ProcessCpuNanos() : -1;
  CloseOpenPhase(page, now, cpu_now);
  if (*name != '\0') {
    g_open.open = true;
    g_open.name = TimingNameIndex(&page->timings, name);
    g_open.start_mono_ns = now;
    g_open.after_step = page->step.load(std::memory_order_relaxed);
    g_open.start_cpu_ns = cpu_timed ? cpu_now : -1;
  }
  WritePhase(page, name, now);
}

std::int64_t LastStep() {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return kNoStep;
  return page->step.load(std::memory_order_relaxed);
}

void RecordDeviceTime(const char* name, std::int64_t start_mono_ns, std::int64_t duration_ns,
                      std::int64_t after_step) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || name == nullptr || duration_ns < 0) return;
  std::lock_guard<std::mutex> lock(g_timing_mu);
  TimingAppend(&page->timings, TimingNameIndex(&page->timings, name), TimingKind::kGpu,
               start_mono_ns, duration_ns, after_step, 0);
}

void CheckpointCommitted(std::int64_t step) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return;
  page->checkpoint_mono_ns.store(MonotonicNowNanos(), std::memory_order_relaxed);
  page->checkpoint_step.store(step, std::memory_order_release);
}

void MarkStartup(int mark) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || mark < 0 || mark >= kStartupMarks) return;
  if (page->first_step_mono_ns.load(std::memory_order_relaxed) != 0) return;
  std::atomic<std::int64_t>& slot = page->startup_mono_ns[mark];
  bool latest = mark == kMarkPgInitEnd || mark == kMarkRestoreEnd;
  if (latest || slot.load(std::memory_order_relaxed) == 0) {
    slot.store(MonotonicNowNanos(), std::memory_order_relaxed);
  }
}

void ResumedFrom(std::int64_t step) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || step < 0) return;
  page->resumed_step.store(step, std::memory_order_relaxed);
}

void ReportFingerprint(std::int64_t step, std::uint64_t fingerprint) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || step < 0) return;
  std::uint64_t seq = page->fingerprint_seq.load(std::memory_order_relaxed);
  page->fingerprint_seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::uint64_t count = page->fingerprint_count.load(std::memory_order_relaxed);
  page->fingerprints[count % kFingerprints].step.store(step, std::memory_order_relaxed);
  page->fingerprints[count % kFingerprints].value.store(fingerprint, std::memory_order_relaxed);
  page->fingerprint_count.store(count + 1, std::memory_order_relaxed);
  page->fingerprint_seq.store(seq + 2, std::memory_order_release);
}

void ReportNumeric(std::int64_t step, int kind, double value) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || step < 0) return;
  const bool spike = kind == kLossSpike || kind == kGradNormSpike;
  std::atomic<std::int64_t>& at = spike ? page->spike_step : page->numeric_step;
  if (at.load(std::memory_order_relaxed) != kNoStep) return;  // the first of each is kept
  (spike ? page->spike_kind : page->numeric_kind).store(kind, std::memory_order_relaxed);
  (spike ? page->spike_value : page->numeric_value)
      .store(std::bit_cast<std::uint64_t>(value), std::memory_order_relaxed);
  at.store(step, std::memory_order_release);
}

std::int64_t VerifiedStep() {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return -1;
  const std::int64_t step = page->verified_step.load(std::memory_order_acquire);
  return step == kNoStep ? -2 : step;
}

void CheckpointPlanMs(std::int64_t* memory_ms, std::int64_t* storage_ms) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  *memory_ms = page == nullptr ? 0 : page->plan_memory_interval_ms.load(std::memory_order_acquire);
  *storage_ms = page == nullptr ? 0 : page->plan_storage_interval_ms.load(std::memory_order_acquire);
}

void NumericObserved() {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page != nullptr) page->losses_observed.fetch_add(1, std::memory_order_relaxed);
}

void AddCheckpointOverhead(std::int64_t nanos) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return;
  if (nanos > 0) page->checkpoint_blocked_ns.fetch_add(nanos, std::memory_order_relaxed);
  page->checkpoint_saves.fetch_add(1, std::memory_order_relaxed);  // one call, one save
}

void AddCheckpointWait(std::int64_t nanos) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || nanos <= 0) return;
  page->checkpoint_waited_ns.fetch_add(nanos, std::memory_order_relaxed);
}

void FileOpened() {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return;
  page->files_opened.fetch_add(1, std::memory_order_relaxed);
}

int JournalGroup(std::int32_t id, const std::string& name, const std::vector<std::int32_t>& members) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return -1;
  std::lock_guard<std::mutex> lock(g_journal_mu);
  return JournalAddGroup(&page->journal, id, name, members);
}

std::int64_t JournalIssue(int group_slot, int op, int dtype, std::int64_t numel, std::int32_t peer,
                          bool on_device) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr) return -1;
  std::int64_t now = MonotonicNowNanos();
  std::lock_guard<std::mutex> lock(g_journal_mu);
  return trainguard::JournalIssue(&page->journal, group_slot, static_cast<OpKind>(op),
                                  static_cast<std::uint16_t>(dtype), numel, peer, now, on_device);
}

void JournalStarted(std::int64_t token) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || token < 0) return;
  std::int64_t now = MonotonicNowNanos();
  std::lock_guard<std::mutex> lock(g_journal_mu);
  trainguard::JournalStarted(&page->journal, token, now);
}

void JournalComplete(std::int64_t token) {
  StatusPage* page = g_page.load(std::memory_order_acquire);
  if (page == nullptr || token < 0) return;
  std::int64_t now = MonotonicNowNanos();
  std::lock_guard<std::mutex> lock(g_journal_mu);
  trainguard::JournalComplete(&page->journal, token, now);
}

void Shutdown() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  g_page.store(nullptr, std::memory_order_release);
  {
    std::lock_guard<std::mutex> timing(g_timing_mu);
    g_open = OpenPhase();  // a page attached later starts with no phase open, no step
    g_first = FirstStep();
  }
  // The mapping stays alive: another thread may still be inside Step() with
  // the old pointer. One 4 KiB mapping per process is the price.
}

}  // namespace trainguard::client

extern "C" {
int tg_init(void) { return trainguard::client::Init() ? 1 : 0; }
void tg_step(int64_t step) { trainguard::client::Step(step); }
void tg_set_phase(const char* name) { trainguard::client::SetPhase(name); }
void tg_checkpoint_committed(int64_t step) { trainguard::client::CheckpointCommitted(step); }
void tg_shutdown(void) { trainguard::client::Shutdown(); }
void tg_add_checkpoint_overhead(int64_t nanos) { trainguard::client::AddCheckpointOverhead(nanos); }
}
