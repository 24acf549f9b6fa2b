// The collective probe with real processes: Debian's Python and PyTorch
// (gloo), an interpreter without torch, one that hangs.
#include "diag/collective_probe.h"
#include "diag/suite.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <string>

#include "testing/scratch_dir.h"

namespace trainguard {
namespace {

bool HasTorch() { return std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") == 0; }

CollectivePlan Plan(const testutil::ScratchDir& dir) {
  CollectivePlan p;
  p.python = "/usr/bin/python3";
  p.script = TG_PROBE_SCRIPT;
  p.work_dir = dir.path();
  p.bytes = 1 << 20;
  p.iters = 2;
  p.timeout = 20 * kSecond;
  return p;
}

int FreePort() {
  // Taken from the kernel's ephemeral range by binding port 0 in Python, as the agent does in C++.
  FILE* f = popen("/usr/bin/python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); "
                  "print(s.getsockname()[1])\"", "r");
  int port = 0;
  if (f != nullptr && std::fscanf(f, "%d", &port) != 1) port = 0;
  if (f != nullptr) pclose(f);
  return port;
}

TEST(CollectiveProbeTest, AnAllToAllAmongTheNodesRanksGivesABandwidth) {
  if (!HasTorch()) GTEST_SKIP() << "no PyTorch in /usr/bin/python3";
  testutil::ScratchDir dir("collective_probe_test");
  CollectivePlan p = Plan(dir);
  p.local_ranks = 2;
  auto figures = RunCollectiveProbe(p);
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_EQ(figures[0].name, "alltoall_gbps");
  EXPECT_EQ(figures[0].error, "");
  EXPECT_GT(figures[0].value, 0);
}

TEST(CollectiveProbeTest, TheNodesOfARackAllReduceTogether) {
  if (!HasTorch()) GTEST_SKIP() << "no PyTorch in /usr/bin/python3";
  const std::string master = "127.0.0.1:" + std::to_string(FreePort());
  auto member = [&](int rank) {
    testutil::ScratchDir dir("collective_probe_test");
  CollectivePlan p = Plan(dir);
    p.rack_rank = rank;
    p.rack_size = 2;
    p.rack_master = master;
    return RunCollectiveProbe(p);
  };
  auto other = std::async(std::launch::async, member, 1);
  auto mine = member(0);
  auto theirs = other.get();
  for (const auto& figures : {mine, theirs}) {
    ASSERT_EQ(figures.size(), 1u);
    EXPECT_EQ(figures[0].name, "rack_allreduce_gbps");
    EXPECT_EQ(figures[0].error, "");
    EXPECT_GT(figures[0].value, 0);
  }
}

TEST(CollectiveProbeTest, ARackPeerThatNeverComesIsAnErrorWithinTheTimeout) {
  if (!HasTorch()) GTEST_SKIP() << "no PyTorch in /usr/bin/python3";
  testutil::ScratchDir dir("collective_probe_test");
  CollectivePlan p = Plan(dir);
  p.rack_rank = 1;
  p.rack_size = 2;
  p.rack_master = "127.0.0.1:" + std::to_string(FreePort());
  p.timeout = 2 * kSecond;
  auto figures = RunCollectiveProbe(p);
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_EQ(figures[0].name, "rack_allreduce_gbps");
  EXPECT_NE(figures[0].error.find("rendezvous at"), std::string::npos) << figures[0].error;
}

TEST(CollectiveProbeTest, GpuFiguresWhereCudaIsAndAShownReasonWhereItIsNot) {
  if (!HasTorch()) GTEST_SKIP() << "no PyTorch in /usr/bin/python3";
  testutil::ScratchDir dir("collective_probe_test");
  CollectivePlan p = Plan(dir);
  p.gpu = true;
  auto figures = RunCollectiveProbe(p);
  ASSERT_FALSE(figures.empty());
  if (std::system("/usr/bin/python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'") == 0) {
    for (const auto& f : figures) {  // gpu_gemm_tflops:I, gpu_h2d_gbps:I, gpu_d2h_gbps:I per device
      EXPECT_EQ(f.error, "") << f.name;
      EXPECT_NE(f.device, "") << f.name;  // the model, for its floors
      if (f.name.rfind("gpu_known_answer_mismatches:", 0) == 0) {
        EXPECT_EQ(f.value, 0) << f.name;  // a healthy GPU computes the known answers right
      } else {
        EXPECT_GT(f.value, 0) << f.name;
      }
    }
    EXPECT_EQ(figures[0].name, "gpu_gemm_tflops:0");
  } else {
    ASSERT_EQ(figures.size(), 1u);
    EXPECT_EQ(figures[0].name, "collective_probe");
    EXPECT_NE(figures[0].error.find("sees no CUDA device"), std::string::npos) << figures[0].error;
  }
}

TEST(CollectiveProbeTest, AnInterpreterWithoutTorchSkipsTheProbeAndSaysWhy) {
  testutil::ScratchDir dir("collective_probe_test");
  CollectivePlan p = Plan(dir);
  p.python = "/usr/bin/python3";
  p.local_ranks = 2;
  // -I: isolated mode does not help against dist-packages; an empty module path does.
  std::string fake = dir / "python-without-torch";
  std::ofstream(fake) << "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n";
  chmod(fake.c_str(), 0755);
  p.python = fake;
  auto figures = RunCollectiveProbe(p);
  ASSERT_EQ(figures.size(), 1u);
  EXPECT_EQ(figures[0].name, "collective_probe");
  EXPECT_NE(figures[0].error.find("not run: torch.distributed with gloo is not importable"), std::string::npos)
      << figures[0].error;
}

TEST(CollectiveProbeTest, AMissingInterpreterAndAHungProbeAreErrorsNotHangs) {
  testutil::ScratchDir dir("collective_probe_test");
  CollectivePlan p = Plan(dir);
  p.local_ranks = 2;
  p.python = "/nonexistent/python3";
  auto missing = RunCollectiveProbe(p);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].error.find("cannot run /nonexistent/python3: No such file"), std::string::npos)
      << missing[0].error;

  std::string hang = dir / "python-that-hangs";
  std::ofstream(hang) << "#!/bin/sh\nsleep 30 & sleep 30\n";
  chmod(hang.c_str(), 0755);
  p.python = hang;
  p.timeout = 0;
  p.grace = 300 * kMillisecond;
  auto hung = RunCollectiveProbe(p);
  ASSERT_EQ(hung.size(), 1u);
  EXPECT_NE(hung[0].error.find("did not finish within"), std::string::npos) << hung[0].error;
}

TEST(CollectiveProbeTest, ReadsTheLastLineOfWhatTheProbePrinted) {
  auto f = CollectiveFiguresFromOutput("a warning\n{\"figures\": [{\"name\": \"alltoall_gbps\", \"value\": 2.5, "
                                       "\"error\": \"all-to-all delivered wrong data: local rank 0 from local "
                                       "rank 1\"}]}\n");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].value, 2.5);
  EXPECT_NE(f[0].error.find("from local rank 1"), std::string::npos);
  auto g = CollectiveFiguresFromOutput(
      "{\"figures\": [{\"name\": \"gpu_gemm_tflops:0\", \"value\": 700, \"device\": \"NVIDIA H100 80GB HBM3\"}]}");
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].device, "NVIDIA H100 80GB HBM3");
  auto back = FiguresFromJson(FiguresToJson(g));  // as the store keeps them
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->at(0).device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(CollectiveFiguresFromOutput("Traceback ...\n")[0].name, "collective_probe");
  EXPECT_EQ(CollectiveFiguresFromOutput("{\"figures\": [{\"name\": 3}]}")[0].name, "collective_probe");
}

}  // namespace
}  // namespace trainguard
