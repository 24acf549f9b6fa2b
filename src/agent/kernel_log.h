// KernelLog: the node's kernel messages (NVIDIA Xid, ECC, link down, OOM
// killer, file system errors) since the agent started, read from /dev/kmsg
// where the agent may read it (root, or CAP_SYSLOG); otherwise empty.
// Thread safety: one thread (the agent's control loop).
#pragma once

#include <deque>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"

namespace trainguard {

class KernelLog {
 public:
  explicit KernelLog(const std::string& path = "/dev/kmsg");
  ~KernelLog();
  KernelLog(const KernelLog&) = delete;
  KernelLog& operator=(const KernelLog&) = delete;

  bool available() const { return fd_ >= 0; }
  // Reads what arrived since the last call (never blocks); returns it.
  std::vector<std::string> Poll();
  // Messages that arrived within `window` before now, oldest first, at most `max`.
  std::vector<std::string> Recent(Nanos window, size_t max) const;

 private:
  int fd_ = -1;
  std::string pending_;                                  // an incomplete record
  std::deque<std::pair<Nanos, std::string>> lines_;  // (arrival, message), capped
};

// The OOM killer's reports name the process they killed. Drops every report
// (from "... invoked oom-killer" to "Killed process N") and every line that
// names a killed or reaped process N whose N is not in `ours`: an OOM kill of
// another job's process, or of this job's previous attempt, is no evidence
// about this failure. Other lines pass as they are.
std::vector<std::string> WithoutOthersOomReports(const std::vector<std::string>& lines,
                                                 const std::set<int>& ours);

}  // namespace trainguard
