#include "agent/standby.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include "testing/wait_until.h"

namespace trainguard {
namespace {

PythonCommand Parse(std::vector<std::string> argv) {
  auto cmd = ParsePythonCommand(argv);
  EXPECT_TRUE(cmd.ok()) << cmd.status().ToString();
  return cmd.ok() ? *cmd : PythonCommand{};
}

std::string Refused(std::vector<std::string> argv) {
  auto cmd = ParsePythonCommand(argv);
  EXPECT_FALSE(cmd.ok());
  return cmd.ok() ? "" : cmd.status().message();
}

TEST(ParsePythonCommandTest, AScriptWithItsArguments) {
  PythonCommand c = Parse({"/usr/bin/python3", "train.py", "--lr", "0.1"});
  EXPECT_EQ(c.interpreter, "/usr/bin/python3");
  EXPECT_TRUE(c.options.empty());
  EXPECT_EQ(c.script, "train.py");
  EXPECT_EQ(c.args, (std::vector<std::string>{"--lr", "0.1"}));
  EXPECT_EQ(c.target(), "train.py");
}

TEST(ParsePythonCommandTest, InterpreterOptionsStayWithTheInterpreter) {
  PythonCommand c = Parse({"python3.11", "-u", "-X", "faulthandler", "-Wignore", "-OB", "train.py", "-u"});
  EXPECT_EQ(c.options, (std::vector<std::string>{"-u", "-X", "faulthandler", "-W", "ignore", "-OB"}));
  EXPECT_EQ(c.script, "train.py");
  EXPECT_EQ(c.args, (std::vector<std::string>{"-u"}));  // the script's own
}

TEST(ParsePythonCommandTest, AModule) {
  PythonCommand c = Parse({"python", "-u", "-m", "torchtitan.train", "--job.config_file", "x.toml"});
  EXPECT_EQ(c.module, "torchtitan.train");
  EXPECT_EQ(c.target(), "-m torchtitan.train");
  EXPECT_EQ(c.args, (std::vector<std::string>{"--job.config_file", "x.toml"}));
  EXPECT_EQ(Parse({"python3", "-umpkg.main"}).module, "pkg.main");
  EXPECT_EQ(Parse({"python3", "-um", "pkg"}).options, (std::vector<std::string>{"-u"}));
}

TEST(ParsePythonCommandTest, WhatCannotRunWarmSaysWhy) {
  EXPECT_NE(Refused({"/bin/bash", "run.sh"}).find("not a Python interpreter"), std::string::npos);
  EXPECT_NE(Refused({"python3-config"}).find("not a Python interpreter"), std::string::npos);
  EXPECT_NE(Refused({"python3", "-c", "print(1)"}).find("-c program"), std::string::npos);
  EXPECT_NE(Refused({"python3"}).find("no script"), std::string::npos);
  EXPECT_NE(Refused({"python3", "-"}).find("no script"), std::string::npos);
  EXPECT_NE(Refused({"python3", "-I", "train.py"}).find("-I"), std::string::npos);
  EXPECT_NE(Refused({"python3", "-sE", "train.py"}).find("-E"), std::string::npos);
  EXPECT_NE(Refused({"python3", "-X"}).find("without its argument"), std::string::npos);
  EXPECT_NE(Refused({"python3", "--version"}).find("--version"), std::string::npos);
  EXPECT_NE(Refused({"python3", "-Z", "train.py"}).find("-Z"), std::string::npos);
  EXPECT_NE(Refused({}).find("not a Python interpreter"), std::string::npos);
}

// A killed standby is left for ReapKilled, which reaps it once it has
// exited: no zombie stays behind, and killing never waits on the exit.
TEST(StandbyTest, AKilledStandbyIsReapedLaterNotWaitedFor) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("standby_test." + std::to_string(getpid()));
  fs::create_directories(dir / "trainguard");
  std::ofstream(dir / "trainguard" / "__init__.py").close();
  std::ofstream(dir / "trainguard" / "_standby.py") << "import time\ndef main():\n    time.sleep(60)\n";
  PythonCommand cmd = Parse({"/usr/bin/python3", "train.py"});
  auto standby = Standby::Launch(cmd, {{"PYTHONPATH", dir.string()}, {"PATH", "/usr/bin:/bin"}}, dir.string(),
                                 (dir / "imports").string(), 0, 0);
  ASSERT_TRUE(standby.ok()) << standby.status().ToString();
  pid_t pid = standby->pid();
  ASSERT_GT(pid, 0);
  std::size_t before = Standby::KilledNotReaped();
  { Standby gone = std::move(*standby); }  // killed: still importing
  testutil::WaitUntil(
      [&] {
        Standby::ReapKilled();
        return Standby::KilledNotReaped() <= before;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(10));
  EXPECT_EQ(Standby::KilledNotReaped(), before);
  errno = 0;
  EXPECT_EQ(kill(pid, 0), -1);  // reaped: not even a zombie
  EXPECT_EQ(errno, ESRCH);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainguard
