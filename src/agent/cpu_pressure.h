// What keeps a node's CPUs from its ranks, sampled at each heartbeat: the
// share of time the ranks' cgroups were throttled by their CPU quota
// (cgroup v2 cpu.stat throttled_usec), the share of CPU time the hypervisor
// took (/proc/stat steal), and how many CPUs the node has. The straggler
// finding names these as its cause when the slow node shows them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"

namespace trainguard {

// The cgroup of a process from /proc/PID/cgroup: its v2 path ("0::/job-3")
// and its v1 cpu controller's ("4:cpu,cpuacct:/job-3"); "" where none.
struct CgroupPaths {
  std::string v2;
  std::string v1_cpu;
};
CgroupPaths CgroupPathsOf(const std::string& proc_pid_cgroup);
// cpu.stat's throttled time in microseconds: v2's throttled_usec, or v1's
// throttled_time (nanoseconds); -1 if absent (no cpu controller).
std::int64_t ThrottledUsec(const std::string& cpu_stat);
// /proc/stat's first line: (steal, total) jiffies; (-1, -1) if unreadable.
std::pair<std::int64_t, std::int64_t> StealAndTotal(const std::string& proc_stat);

struct CpuPressureSample {
  double throttled_pct = -1;  // the most throttled of the ranks' cgroups since the last sample; -1 unknown
  double steal_pct = -1;      // since the last sample; -1 unknown
  int cores = 0;
};

class CpuPressure {
 public:
  explicit CpuPressure(std::string proc_root = "/proc", std::string cgroup_root = "/sys/fs/cgroup")
      : proc_root_(std::move(proc_root)), cgroup_root_(std::move(cgroup_root)) {}
  // `pids`: the ranks' main processes.
  CpuPressureSample Sample(const std::vector<pid_t>& pids, Nanos now_mono);

 private:
  std::string proc_root_, cgroup_root_;
  std::map<std::string, std::pair<std::int64_t, Nanos>> throttled_;  // cgroup -> (usec, when)
  std::int64_t steal_ = -1, total_ = -1;
};

}  // namespace trainguard
