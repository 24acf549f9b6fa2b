#include "agent/kernel_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <regex>

namespace trainguard {

namespace {
constexpr size_t kKeep = 500;
}  // namespace

KernelLog::KernelLog(const std::string& path) {
  fd_ = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ >= 0) lseek(fd_, 0, SEEK_END);  // only what happens from now on
}

KernelLog::~KernelLog() {
  if (fd_ >= 0) close(fd_);
}

std::vector<std::string> KernelLog::Poll() {
  std::vector<std::string> fresh;
  if (fd_ < 0) return fresh;
  char buf[8192];
  for (int i = 0; i < 1000; ++i) {
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n < 0 && errno == EPIPE) continue;  // records were overwritten; go on with the next
    if (n <= 0) return fresh;               // EAGAIN (or end of a plain file): nothing new
    // /dev/kmsg gives one record per read: "prio,seq,usec,flags;message" and
    // continuation lines starting with a space ("KEY=value"), which are skipped.
    pending_.append(buf, static_cast<size_t>(n));
    size_t pos;
    while ((pos = pending_.find('\n')) != std::string::npos) {
      std::string line = pending_.substr(0, pos);
      pending_.erase(0, pos + 1);
      auto semi = line.find(';');
      if (line.empty() || line[0] == ' ' || semi == std::string::npos) continue;
      lines_.emplace_back(MonotonicNowNanos(), line.substr(semi + 1));
      fresh.push_back(lines_.back().second);
      if (lines_.size() > kKeep) lines_.pop_front();
    }
  }
  return fresh;
}

std::vector<std::string> KernelLog::Recent(Nanos window, size_t max) const {
  std::vector<std::string> out;
  Nanos since = MonotonicNowNanos() - window;
  for (const auto& [when, line] : lines_) {
    if (when >= since) out.push_back(line);
  }
  if (out.size() > max) out.erase(out.begin(), out.end() - static_cast<long>(max));
  return out;
}

namespace {

// The process an OOM-killer line names as killed or reaped, if any.
std::optional<int> OomVictim(const std::string& line) {
  static const std::regex victim(
      R"((?:Kill(?:ed)? process|reaped process|oom-kill:.*[,:]pid=)\s*(\d+))");
  std::smatch m;
  if (!std::regex_search(line, m, victim)) return std::nullopt;
  return std::atoi(m[1].str().c_str());
}

}  // namespace

std::vector<std::string> WithoutOthersOomReports(const std::vector<std::string>& lines,
                                                 const std::set<int>& ours) {
  std::vector<std::string> out;
  std::vector<std::string> report;  // an OOM report not yet closed by its victim
  bool in_report = false;
  for (const auto& line : lines) {
    if (line.find("invoked oom-killer") != std::string::npos) {
      out.insert(out.end(), report.begin(), report.end());  // an unclosed one stays
      report = {line};
      in_report = true;
      continue;
    }
    std::optional<int> victim = OomVictim(line);
    bool closes = line.find("Killed process") != std::string::npos ||
                  line.find("Kill process") != std::string::npos;
    if (in_report) {
      report.push_back(line);
      if (victim && closes) {
        if (ours.count(*victim)) out.insert(out.end(), report.begin(), report.end());
        report.clear();
        in_report = false;
      }
      continue;
    }
    if (victim && !ours.count(*victim)) continue;
    out.push_back(line);
  }
  out.insert(out.end(), report.begin(), report.end());
  return out;
}

}  // namespace trainguard
