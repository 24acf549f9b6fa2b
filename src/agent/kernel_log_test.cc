#include "agent/kernel_log.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

// An OOM-killer report as Linux 6.x writes it into /dev/kmsg (abridged).
std::vector<std::string> Report(int pid) {
  std::string p = std::to_string(pid);
  return {"python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
          "Call Trace:",
          " oom_kill_process.cold+0x8/0x8a",
          "Memory cgroup stats for /job:",
          "[  pid  ]   uid  tgid total_vm      rss rss_anon name",
          "[    " + p + "]     0   " + p + "   157089    51200    51100 python3",
          "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
          "oom_memcg=/job,task_memcg=/job,task=python3,pid=" + p + ",uid=0",
          "Memory cgroup out of memory: Killed process " + p + " (python3) total-vm:628356kB, "
          "anon-rss:204288kB, file-rss:5376kB, shmem-rss:0kB, UID:0 pgtables:468kB oom_score_adj:0"};
}

std::vector<std::string> Concat(std::vector<std::vector<std::string>> parts) {
  std::vector<std::string> all;
  for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST(KernelLogTest, KeepsTheOomReportAboutOurOwnProcess) {
  auto lines = Concat({{"NVRM: Xid (PCI:0000:3b:00): 79"}, Report(528)});
  EXPECT_EQ(WithoutOthersOomReports(lines, {528, 529}), lines);
}

TEST(KernelLogTest, DropsWholeReportsAboutOtherProcessesAndKeepsTheRest) {
  auto lines = Concat({Report(777), {"EXT4-fs error (device sda1): bad block"}, Report(528),
                       {"oom_reaper: reaped process 777 (python3), now anon-rss:0kB"}});
  auto kept = WithoutOthersOomReports(lines, {528});
  EXPECT_EQ(kept, Concat({{"EXT4-fs error (device sda1): bad block"}, Report(528)}));
}

TEST(KernelLogTest, OlderKernelsWordingAndAnUnfinishedReport) {
  std::vector<std::string> old = {"Out of memory: Kill process 4242 (python) score 901 or sacrifice child",
                                  "Killed process 4242 (python) total-vm:100kB"};
  EXPECT_TRUE(WithoutOthersOomReports(old, {1}).empty());
  EXPECT_EQ(WithoutOthersOomReports(old, {4242}), old);
  // A report still being written names no victim yet: it is kept.
  std::vector<std::string> open = {"python3 invoked oom-killer: gfp_mask=0xcc0", "Call Trace:"};
  EXPECT_EQ(WithoutOthersOomReports(open, {1}), open);
}

}  // namespace
}  // namespace trainguard
