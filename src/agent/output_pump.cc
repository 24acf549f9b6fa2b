#include "agent/output_pump.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace trainguard {

namespace {
std::mutex g_console_mu;  // one whole line at a time on the agent's stdout and stderr
}  // namespace

OutputPump::OutputPump(int stdout_fd, int stderr_fd, const std::string& log_base,
                       std::string prefix, bool echo, size_t tail_lines, LineSink sink)
    : prefix_(std::move(prefix)), echo_(echo), tail_max_(tail_lines), sink_(std::move(sink)) {
  streams_[0].fd = stdout_fd;
  streams_[0].log = std::fopen((log_base + ".stdout.log").c_str(), "ae");
  streams_[0].console = stdout;
  streams_[1].fd = stderr_fd;
  streams_[1].log = std::fopen((log_base + ".stderr.log").c_str(), "ae");
  streams_[1].console = stderr;
  thread_ = std::thread([this] { Loop(); });
}

OutputPump::~OutputPump() { Finish(0); }

void OutputPump::Finish(Nanos wait) {
  if (!thread_.joinable()) return;
  Nanos deadline = MonotonicNowNanos() + wait;
  while (!eof_.load() && MonotonicNowNanos() < deadline) usleep(5000);
  stop_ = true;
  thread_.join();
  for (Stream& s : streams_) {
    close(s.fd);
    if (s.log != nullptr) std::fclose(s.log);
    s.log = nullptr;
  }
}

Nanos OutputPump::eof_wall() const { return eof_ ? eof_wall_.load() : 0; }

std::vector<std::string> OutputPump::Tail() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out(tail_.begin(), tail_.end());
  for (const Stream& s : streams_) {
    if (!s.partial.empty()) out.push_back(s.partial);
  }
  return out;
}

void OutputPump::Loop() {
  char buf[8192];
  while (!stop_.load()) {
    pollfd p[2];
    nfds_t n = 0;
    Stream* polled[2];
    for (Stream& s : streams_) {
      if (!s.open) continue;
      p[n] = pollfd{s.fd, POLLIN, 0};
      polled[n++] = &s;
    }
    if (n == 0) return;
    if (poll(p, n, 50) <= 0) continue;
    for (nfds_t i = 0; i < n; ++i) {
      if (p[i].revents == 0) continue;
      Stream& s = *polled[i];
      ssize_t got = read(s.fd, buf, sizeof(buf));
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) {
        s.open = false;
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.partial.empty()) Line(s, s.partial), s.partial.clear();  // a last line without newline
        if (!streams_[0].open && !streams_[1].open) {
          eof_wall_ = WallNowNanos();
          eof_ = true;
        }
        continue;
      }
      Drain(s, buf, static_cast<size_t>(got));
    }
  }
}

void OutputPump::Drain(Stream& s, const char* data, size_t n) {
  if (s.log != nullptr) {
    std::fwrite(data, 1, n, s.log);
    std::fflush(s.log);
  }
  std::lock_guard<std::mutex> lock(mu_);
  s.partial.append(data, n);
  size_t pos;
  while ((pos = s.partial.find('\n')) != std::string::npos) {
    Line(s, s.partial.substr(0, pos));
    s.partial.erase(0, pos + 1);
  }
}

void OutputPump::Line(Stream& s, const std::string& line) {
  last_line_wall_ = WallNowNanos();
  if (sink_) sink_(line);
  tail_.push_back(line);
  while (tail_.size() > tail_max_) tail_.pop_front();
  if (echo_) {
    std::lock_guard<std::mutex> lock(g_console_mu);
    std::fprintf(s.console, "%s%s\n", prefix_.c_str(), line.c_str());
    std::fflush(s.console);
  }
}

}  // namespace trainguard
