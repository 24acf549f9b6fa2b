// RunProgram with real processes: output, exit status, a missing program,
// the deadline (the whole group killed), and a tool that never outlives the
// process that ran it.
#include "diag/run_program.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include "testing/wait_until.h"

#include "testing/scratch_dir.h"

namespace trainguard {
namespace {

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

pid_t ReadPid(const std::string& path, std::chrono::seconds within) {
  pid_t pid = 0;
  testutil::WaitUntil(
      [&] {
        std::ifstream f(path);
        return f >> pid && pid > 0;
      },
      within, std::chrono::milliseconds(10));
  return pid > 0 ? pid : 0;
}

bool GoneWithin(pid_t pid, std::chrono::seconds within) {
  return testutil::WaitUntil([&] { return !Alive(pid); }, within, std::chrono::milliseconds(10));
}

TEST(RunProgramTest, CollectsOutputAndExitStatus) {
  ProgramResult r = RunProgram({"/bin/sh", "-c", "echo hello; exit 3"}, 10 * kSecond);
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.output, "hello\n");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.Describe("sh"), "sh exited with 3");
}

TEST(RunProgramTest, AMissingProgramSaysWhy) {
  ProgramResult r = RunProgram({"/nonexistent/tool"}, 10 * kSecond);
  EXPECT_FALSE(r.started);
  EXPECT_EQ(r.Describe("/nonexistent/tool"), "cannot run /nonexistent/tool: No such file or directory");
}

TEST(RunProgramTest, TheDeadlineKillsTheWholeGroup) {
  testutil::ScratchDir dir("run_program_test");
  const std::string pidfile = dir / "child.pid";
  ProgramResult r = RunProgram({"/bin/sh", "-c", "sleep 30 & echo $! > " + pidfile + "; sleep 30"},
                               300 * kMillisecond);
  EXPECT_TRUE(r.timed_out);
  pid_t child = ReadPid(pidfile, std::chrono::seconds(5));
  ASSERT_GT(child, 0);
  EXPECT_TRUE(GoneWithin(child, std::chrono::seconds(5)));
}

TEST(RunProgramTest, TheToolDiesWithTheProcessThatRanIt) {
  testutil::ScratchDir dir("run_program_test");
  const std::string pidfile = dir / "tool.pid";
  pid_t agent = fork();  // stands in for an agent that is killed during a probe
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    RunProgram({"/bin/sh", "-c", "echo $$ > " + pidfile + "; exec sleep 30"}, 60 * kSecond);
    _exit(0);
  }
  pid_t tool = ReadPid(pidfile, std::chrono::seconds(5));
  ASSERT_GT(tool, 0);
  kill(agent, SIGKILL);
  waitpid(agent, nullptr, 0);
  EXPECT_TRUE(GoneWithin(tool, std::chrono::seconds(5)));
  if (Alive(tool)) kill(tool, SIGKILL);
}

}  // namespace
}  // namespace trainguard
