// Parsing what Slurm prints (lines as Slurm 22.05 prints them), and the
// allocation from the environment.
#include "cli/slurm.h"

#include <cstdlib>

#include "cli/cli_support.h"

#include <gtest/gtest.h>

#include <map>

namespace trainguard {
namespace {

TEST(SlurmTest, ReadsANodesAddressStateAndReasonWithSpaces) {
  const std::string line =
      "NodeName=sn2 Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=2.36 "
      "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.225.244.2 NodeHostName=sn2 "
      "Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 "
      "FreeMem=20613 Sockets=1 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
      "MCS_label=N/A Partitions=debug  BootTime=2026-11-23T08:25:20 SlurmdStartTime=2026-11-23T22:14:41 "
      "CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
      "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
      "Reason=trainguard job x incident 1: gpu_hardware (xid 79) on rank 2 [root@2026-11-23T22:14:45]\n";
  SlurmNodeInfo n = ParseScontrolNode(line);
  EXPECT_EQ(n.name, "sn2");
  EXPECT_EQ(n.address, "10.225.244.2");
  EXPECT_EQ(n.state, "IDLE+DRAIN");
  EXPECT_EQ(n.reason, "trainguard job x incident 1: gpu_hardware (xid 79) on rank 2");
  EXPECT_FALSE(n.Failed());
}

TEST(SlurmTest, DownFailAndNotRespondingAreFailures) {
  for (const char* state : {"DOWN+NOT_RESPONDING", "ALLOCATED+NOT_RESPONDING", "FAIL", "DOWN+DRAIN"}) {
    SlurmNodeInfo n = ParseScontrolNode(std::string("NodeName=a NodeAddr=h State=") + state + " Weight=1");
    EXPECT_TRUE(n.Failed()) << state;
  }
  for (const char* state : {"IDLE", "ALLOCATED", "MIXED+DRAIN", "ALLOCATED+COMPLETING"}) {
    SlurmNodeInfo n = ParseScontrolNode(std::string("NodeName=a NodeAddr=h State=") + state + " Weight=1");
    EXPECT_FALSE(n.Failed()) << state;
  }
  EXPECT_EQ(ParseScontrolNode("Node sn9 not found").name, "");
}

TEST(SlurmTest, ADrainReasonIsOneShortLineNamingTheJob) {
  EXPECT_EQ(DrainReason("j7", "incident 2: gpu_hardware\non rank 3"),
            "trainguard job j7: incident 2: gpu_hardware on rank 3");
  std::string long_reason = DrainReason("j", std::string(1000, 'x'));
  EXPECT_EQ(long_reason.size(), 250u);
  EXPECT_EQ(long_reason.substr(247), "...");
}

TEST(SlurmTest, ReadsSlurmdsPortFromTheConfiguration) {
  EXPECT_EQ(ParseSlurmdPort("Configuration data as of 2026-11-23T22:14:45\nSlurmctldPort           = 6817\n"
                            "SlurmdPidFile           = /run/slurmd.pid\nSlurmdPort              = 37013\n"
                            "SlurmdSpoolDir          = /var/spool/slurmd\n"),
            37013);
  EXPECT_EQ(ParseSlurmdPort("SlurmctldPort = 6817\n"), 6818);
}

TEST(SlurmTest, TheAllocationComesFromTheBatchScriptsEnvironment) {
  std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "42"}, {"SLURM_JOB_NODELIST", "sn[1-5]"}, {"SLURMD_NODENAME", "sn1"}};
  auto get = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  auto a = SlurmAllocationFromEnv(get);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->job_id, "42");
  EXPECT_EQ(a->nodelist, "sn[1-5]");
  EXPECT_EQ(a->this_node, "sn1");
  env.erase("SLURMD_NODENAME");
  auto login = SlurmAllocationFromEnv(get);
  ASSERT_FALSE(login.ok());
  EXPECT_NE(login.status().message().find("not on the login node"), std::string::npos);
  env.clear();
  auto outside = SlurmAllocationFromEnv(get);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("SLURM_JOB_ID is not set"), std::string::npos);
}

// Under Slurm a job's default id is Slurm's (two jobs starting in the same
// second in PID namespaces could share a time-and-pid id in a fleet store).
TEST(DefaultJobIdTest, UnderSlurmItIsTheClustersJobIdAndARequeueIsApart) {
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_CLUSTER_NAME", "eos", 1);
  unsetenv("SLURM_RESTART_COUNT");
  EXPECT_EQ(DefaultJobId(), "eos-4242");
  setenv("SLURM_RESTART_COUNT", "2", 1);
  EXPECT_EQ(DefaultJobId(), "eos-4242-r2");
  unsetenv("SLURM_CLUSTER_NAME");
  unsetenv("SLURM_RESTART_COUNT");
  EXPECT_EQ(DefaultJobId(), "slurm-4242");
  unsetenv("SLURM_JOB_ID");
  std::string a = DefaultJobId();  // job-YYYYmmdd-HHMMSS-PID-XXXX: 16 random bits after the pid
  EXPECT_EQ(a.rfind("job-", 0), 0u) << a;
  EXPECT_EQ(a.substr(a.rfind('-') + 1).find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_EQ(a.size() - a.rfind('-') - 1, 4u) << a;
}

}  // namespace
}  // namespace trainguard
