#include "agent/cpu_pressure.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "common/small_file.h"

namespace trainguard {

CgroupPaths CgroupPathsOf(const std::string& text) {
  CgroupPaths out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    // ID:CONTROLLERS:PATH; the path may hold ':'.
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      out.v2 = path;
      continue;
    }
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');) {
      if (c == "cpu") out.v1_cpu = path;
    }
  }
  return out;
}

std::int64_t ThrottledUsec(const std::string& cpu_stat) {
  std::istringstream in(cpu_stat);
  std::string key;
  std::int64_t value = 0;
  while (in >> key >> value) {
    if (key == "throttled_usec") return value;
    if (key == "throttled_time") return value / 1000;
  }
  return -1;
}

std::pair<std::int64_t, std::int64_t> StealAndTotal(const std::string& proc_stat) {
  std::istringstream in(proc_stat);
  std::string cpu;
  if (!(in >> cpu) || cpu != "cpu") return {-1, -1};
  // user nice system idle iowait irq softirq steal [guest guest_nice: inside user and nice]
  std::int64_t v[8] = {};
  for (auto& x : v) {
    if (!(in >> x)) return {-1, -1};
  }
  std::int64_t total = 0;
  for (auto x : v) total += x;
  return {v[7], total};
}

CpuPressureSample CpuPressure::Sample(const std::vector<pid_t>& pids, Nanos now_mono) {
  CpuPressureSample out;
  out.cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  // Each rank's cpu.stat: the v1 cpu controller's where it has one (a
  // hybrid host's quota sits there), else v2's (at the root, or under
  // "unified" on a hybrid host).
  std::set<std::string> stats;
  for (pid_t pid : pids) {
    const CgroupPaths p = CgroupPathsOf(ReadSmallFile(proc_root_ + "/" + std::to_string(pid) + "/cgroup"));
    std::vector<std::string> candidates;
    if (!p.v1_cpu.empty()) {
      candidates = {cgroup_root_ + "/cpu" + p.v1_cpu, cgroup_root_ + "/cpu,cpuacct" + p.v1_cpu};
    } else if (!p.v2.empty()) {
      candidates = {cgroup_root_ + p.v2, cgroup_root_ + "/unified" + p.v2};
    }
    for (const std::string& dir : candidates) {
      if (access((dir + "/cpu.stat").c_str(), R_OK) == 0) {
        stats.insert(dir + "/cpu.stat");
        break;
      }
    }
  }
  std::map<std::string, std::pair<std::int64_t, Nanos>> next;
  for (const std::string& g : stats) {
    std::int64_t usec = ThrottledUsec(ReadSmallFile(g));
    if (usec < 0) continue;
    next[g] = {usec, now_mono};
    auto prev = throttled_.find(g);
    if (prev == throttled_.end() || now_mono <= prev->second.second || usec < prev->second.first) continue;
    const double share = static_cast<double>(usec - prev->second.first) * 1000 /
                         static_cast<double>(now_mono - prev->second.second);
    out.throttled_pct = std::max(out.throttled_pct, std::min(100.0, 100 * share));
  }
  throttled_ = std::move(next);  // cgroups no rank is in any more are forgotten
  auto [steal, total] = StealAndTotal(ReadSmallFile(proc_root_ + "/stat"));
  if (steal >= 0 && steal_ >= 0 && total > total_ && steal >= steal_) {
    out.steal_pct = 100.0 * static_cast<double>(steal - steal_) / static_cast<double>(total - total_);
  }
  steal_ = steal;
  total_ = total;
  return out;
}

}  // namespace trainguard
