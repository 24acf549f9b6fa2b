// OutputPump: carries one rank's stdout and stderr, kept apart, to its two
// log files and (prefixed "[rankN]: ") to this process's stdout and stderr,
// and keeps the rank's last lines, in the order they came, for failure reports.
#pragma once

#include <atomic>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace trainguard {

class OutputPump {
 public:
  // Called with every whole line, on the pump's thread.
  using LineSink = std::function<void(const std::string& line)>;

  // Takes ownership of both descriptors. `log_base` + ".stdout.log" and
  // ".stderr.log" are appended to.
  OutputPump(int stdout_fd, int stderr_fd, const std::string& log_base, std::string prefix,
             bool echo, size_t tail_lines, LineSink sink = nullptr);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Waits up to `wait` for the writer side of both pipes to close, then stops reading.
  void Finish(Nanos wait);

  // When the process closed its output (at its exit, as a rule); 0 if not yet.
  Nanos eof_wall() const;

  // When the last whole line came (0: none yet).
  Nanos last_line_wall() const { return last_line_wall_.load(); }

  // The last lines of both streams, oldest first.
  std::vector<std::string> Tail();

 private:
  struct Stream {
    int fd = -1;
    std::FILE* log = nullptr;
    std::FILE* console = nullptr;
    std::string partial;
    bool open = true;
  };
  void Loop();
  void Drain(Stream& s, const char* data, size_t n);
  void Line(Stream& s, const std::string& line);  // mu_ held

  Stream streams_[2];
  std::string prefix_;
  bool echo_;
  size_t tail_max_;
  LineSink sink_;
  std::mutex mu_;
  std::deque<std::string> tail_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> eof_{false};
  std::atomic<Nanos> eof_wall_{0};
  std::atomic<Nanos> last_line_wall_{0};
  std::thread thread_;
};

}  // namespace trainguard
