#include "common/status_page.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace trainguard {

std::string StatusPageName(const std::string& job, const std::string& node, long agent_pid, int rank) {
  return "trainguard-" + job + "-" + node + "-" + std::to_string(agent_pid) + "-r" + std::to_string(rank);
}

long StatusPageAgent(const std::string& name) {
  if (name.rfind("trainguard-", 0) != 0) return 0;
  const std::size_t r = name.rfind("-r");
  if (r == std::string::npos || r + 2 >= name.size() ||
      name.find_first_not_of("0123456789", r + 2) != std::string::npos) {
    return 0;
  }
  const std::size_t dash = name.rfind('-', r - 1);
  if (dash == std::string::npos || dash + 1 >= r) return 0;
  const std::string pid = name.substr(dash + 1, r - dash - 1);
  if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stol(pid);
}

int RemoveStalePages(const std::string& dir, const std::string& prefix, int min_age_s) {
  int removed = 0;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || StatusPageAgent(name) <= 0) continue;
    std::error_code time_ec;
    const auto written = entry.last_write_time(time_ec);
    if (min_age_s > 0 && (time_ec || now - written < std::chrono::seconds(min_age_s))) continue;
    if (RemoveIfStale(entry.path().string())) ++removed;
  }
  return removed;
}

void InitStatusPage(StatusPage* page) {
  std::memset(static_cast<void*>(page), 0, sizeof(StatusPage));
  page->magic = kStatusPageMagic;
  page->version = kStatusPageVersion;
  page->size = static_cast<std::uint32_t>(kStatusPageSize);
  page->step.store(kNoStep);
  page->checkpoint_step.store(kNoStep);
  page->resumed_step.store(kNoStep);
  page->numeric_step.store(kNoStep);
  page->spike_step.store(kNoStep);
  page->verified_step.store(kNoStep);
  page->first_step.store(kNoStep);
  InitJournal(&page->journal);
}

void WritePhase(StatusPage* page, const char* name, std::int64_t now_mono_ns) {
  std::uint64_t seq = page->phase_seq.load(std::memory_order_relaxed);
  page->phase_seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::size_t n = std::min(std::strlen(name), kPhaseNameCapacity - 1);
  std::memcpy(page->phase_name, name, n);
  page->phase_name[n] = '\0';
  page->phase_mono_ns.store(now_mono_ns, std::memory_order_relaxed);
  page->phase_seq.store(seq + 2, std::memory_order_release);
}

StatusSnapshot ReadStatusPage(const StatusPage& page) {
  StatusSnapshot s;
  s.pid = page.pid.load(std::memory_order_acquire);
  s.attached = s.pid != 0;
  s.attach_mono_ns = page.attach_mono_ns.load(std::memory_order_relaxed);
  s.first_step = page.first_step.load(std::memory_order_acquire);
  s.step = page.step.load(std::memory_order_acquire);
  s.step_count = page.step_count.load(std::memory_order_relaxed);
  s.last_step_mono_ns = page.last_step_mono_ns.load(std::memory_order_relaxed);
  s.first_step_mono_ns = page.first_step_mono_ns.load(std::memory_order_relaxed);
  s.checkpoint_step = page.checkpoint_step.load(std::memory_order_acquire);
  s.checkpoint_blocked_ns = page.checkpoint_blocked_ns.load(std::memory_order_relaxed);
  s.checkpoint_waited_ns = page.checkpoint_waited_ns.load(std::memory_order_relaxed);
  s.checkpoint_saves = page.checkpoint_saves.load(std::memory_order_relaxed);
  s.files_opened = page.files_opened.load(std::memory_order_relaxed);
  s.max_step_ns = page.max_step_ns.load(std::memory_order_relaxed);
  for (int i = 0; i < kStartupMarks; ++i) s.startup_mono_ns[i] = page.startup_mono_ns[i].load(std::memory_order_relaxed);
  s.resumed_step = page.resumed_step.load(std::memory_order_relaxed);
  s.numeric_step = page.numeric_step.load(std::memory_order_acquire);
  if (s.numeric_step != kNoStep) {
    s.numeric_kind = page.numeric_kind.load(std::memory_order_relaxed);
    s.numeric_value = std::bit_cast<double>(page.numeric_value.load(std::memory_order_relaxed));
  }
  s.losses_observed = page.losses_observed.load(std::memory_order_relaxed);
  s.spike_step = page.spike_step.load(std::memory_order_acquire);
  if (s.spike_step != kNoStep) {
    s.spike_kind = page.spike_kind.load(std::memory_order_relaxed);
    s.spike_value = std::bit_cast<double>(page.spike_value.load(std::memory_order_relaxed));
  }
  for (int attempt = 0; attempt < 100; ++attempt) {  // the same bounded seqlock read as the phase's
    std::uint64_t before = page.fingerprint_seq.load(std::memory_order_acquire);
    if (before & 1) continue;
    std::uint64_t count = page.fingerprint_count.load(std::memory_order_relaxed);
    std::vector<std::pair<std::int64_t, std::uint64_t>> ring;
    for (std::uint64_t i = count > kFingerprints ? count - kFingerprints : 0; i < count; ++i) {
      const auto& e = page.fingerprints[i % kFingerprints];
      ring.push_back({e.step.load(std::memory_order_relaxed), e.value.load(std::memory_order_relaxed)});
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (page.fingerprint_seq.load(std::memory_order_relaxed) != before) continue;
    s.fingerprints = std::move(ring);
    break;
  }
  // A writer that died mid-update leaves the counter odd forever: give up after
  // a bounded number of tries and report no phase rather than spin.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::uint64_t before = page.phase_seq.load(std::memory_order_acquire);
    if (before & 1) continue;
    char buf[kPhaseNameCapacity];
    std::memcpy(buf, page.phase_name, sizeof(buf));
    std::int64_t since = page.phase_mono_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (page.phase_seq.load(std::memory_order_relaxed) != before) continue;
    buf[kPhaseNameCapacity - 1] = '\0';
    s.phase = buf;
    s.phase_mono_ns = since;
    break;
  }
  return s;
}

MappedStatusPage::~MappedStatusPage() {
  if (page_ != nullptr) munmap(page_, kStatusPageSize);
  if (lock_fd_ >= 0) close(lock_fd_);
}

MappedStatusPage::MappedStatusPage(MappedStatusPage&& other) noexcept
    : page_(other.page_), path_(std::move(other.path_)), lock_fd_(other.lock_fd_) {
  other.page_ = nullptr;
  other.lock_fd_ = -1;
}

MappedStatusPage& MappedStatusPage::operator=(MappedStatusPage&& other) noexcept {
  if (this != &other) {
    if (page_ != nullptr) munmap(page_, kStatusPageSize);
    if (lock_fd_ >= 0) close(lock_fd_);
    page_ = other.page_;
    path_ = std::move(other.path_);
    lock_fd_ = other.lock_fd_;
    other.page_ = nullptr;
    other.lock_fd_ = -1;
  }
  return *this;
}

bool RemoveIfStale(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // Its creator holds a shared lock for the page's life; the kernel drops
  // it when that process ends, however it ends, in whatever pid namespace.
  const bool stale = flock(fd, LOCK_EX | LOCK_NB) == 0;
  const bool removed = stale && unlink(path.c_str()) == 0;
  close(fd);
  return removed;
}

static StatusOr<StatusPage*> MapFd(int fd, const std::string& path) {
  void* p = mmap(nullptr, kStatusPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return IoError("mmap " + path + ": " + std::strerror(err));
  return static_cast<StatusPage*>(p);
}

StatusOr<MappedStatusPage> MappedStatusPage::Create(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("create status page " + path + ": " + std::strerror(errno));
  // Held while this object lives: the page is in use (RemoveIfStale).
  flock(fd, LOCK_SH);
  const int lock_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (ftruncate(fd, kStatusPageSize) != 0) {
    int err = errno;
    close(fd);
    return IoError("size status page " + path + ": " + std::strerror(err));
  }
  auto mapped = MapFd(fd, path);
  if (!mapped.ok()) {
    if (lock_fd >= 0) close(lock_fd);
    return mapped.status();
  }
  MappedStatusPage page;
  page.page_ = mapped.value();
  page.path_ = path;
  page.lock_fd_ = lock_fd;
  InitStatusPage(page.page_);
  return page;
}

StatusOr<MappedStatusPage> MappedStatusPage::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return IoError("open status page " + path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kStatusPageSize)) {
    close(fd);
    return InvalidArgument("status page " + path + " is smaller than " +
                           std::to_string(kStatusPageSize) + " bytes");
  }
  auto mapped = MapFd(fd, path);
  if (!mapped.ok()) return mapped.status();
  MappedStatusPage page;
  page.page_ = mapped.value();
  page.path_ = path;
  if (page.page_->magic != kStatusPageMagic || page.page_->version != kStatusPageVersion) {
    return FailedPrecondition("status page " + path + " has magic/version " +
                              std::to_string(page.page_->magic) + "/" +
                              std::to_string(page.page_->version) + ", expected version " +
                              std::to_string(kStatusPageVersion));
  }
  return page;
}

}  // namespace trainguard
