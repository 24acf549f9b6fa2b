#include "trainguard/client.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/status_page.h"
#include "trainguard/c_api.h"

namespace trainguard {
namespace {

TEST(ClientTest, WithoutAgentEveryCallIsANoOp) {
  unsetenv(client::kStatusPageEnv);
  EXPECT_FALSE(client::Init());
  EXPECT_FALSE(client::Attached());
  client::Step(3);
  client::SetPhase("forward");
  client::CheckpointCommitted(2);
}

TEST(ClientTest, WritesProgressIntoThePageTheAgentReads) {
  std::string path = testing::TempDir() + "/client_test_page_" + std::to_string(getpid());
  auto page = MappedStatusPage::Create(path);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  setenv(client::kStatusPageEnv, path.c_str(), 1);
  ASSERT_EQ(tg_init(), 1);
  EXPECT_TRUE(client::Attached());

  StatusSnapshot before = ReadStatusPage(*page->get());
  EXPECT_EQ(before.pid, getpid());
  EXPECT_EQ(before.step, kNoStep);

  client::Step(1);
  tg_step(7);
  client::SetPhase("backward");
  client::CheckpointCommitted(5);
  client::AddCheckpointOverhead(1500);
  tg_add_checkpoint_overhead(500);
  client::AddCheckpointWait(1200);  // of which waiting for the previous save's write

  StatusSnapshot s = ReadStatusPage(*page->get());
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.step_count, 2);
  EXPECT_GT(s.first_step_mono_ns, 0);
  EXPECT_GE(s.last_step_mono_ns, s.first_step_mono_ns);
  EXPECT_EQ(s.phase, "backward");
  EXPECT_EQ(s.checkpoint_step, 5);
  EXPECT_EQ(s.checkpoint_blocked_ns, 2000);
  EXPECT_EQ(s.checkpoint_waited_ns, 1200);

  client::Shutdown();
  client::Step(100);
  EXPECT_EQ(ReadStatusPage(*page->get()).step, 7);
  unsetenv(client::kStatusPageEnv);
  unlink(path.c_str());
}

// The process's CPU time, in nanoseconds.
std::int64_t CpuNanos() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Phases are timed into the ring: each ends at the next SetPhase, a phase
// open at a step is split there, and each step has a record of its own.
// Compute phases (forward, backward, optimizer) also get a record of the
// CPU time the process used in them.
TEST(ClientTest, TimesPhasesAndStepsIntoTheRing) {
  std::string path = testing::TempDir() + "/client_test_timing_" + std::to_string(getpid());
  auto page = MappedStatusPage::Create(path);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  setenv(client::kStatusPageEnv, path.c_str(), 1);
  ASSERT_TRUE(client::Init());
  client::SetPhase("forward");
  const std::int64_t spin_until = CpuNanos() + 2000000;  // 2 ms of CPU in forward
  while (CpuNanos() < spin_until) {
  }
  client::SetPhase("backward");
  client::SetPhase("optimizer");
  client::Step(10);       // inside optimizer: it is split
  client::SetPhase("");   // the rest of optimizer belongs to the next step
  client::SetPhase("gc");
  client::SetPhase("");
  client::RecordDeviceTime("forward", 5, 7, 10);
  EXPECT_EQ(client::LastStep(), 10);
  TimingCursor cursor;
  std::vector<TimingSample> t = cursor.Drain(page->get()->timings);
  ASSERT_EQ(t.size(), 11u);
  EXPECT_EQ(t[0].name, "forward");
  EXPECT_EQ(t[0].kind, TimingKind::kPhase);
  EXPECT_EQ(t[0].after_step, kNoStep);
  EXPECT_EQ(t[1].name, "forward");
  EXPECT_EQ(t[1].kind, TimingKind::kCpu);
  EXPECT_GE(t[1].duration_ns, 2000000);  // the CPU it spun for
  EXPECT_EQ(t[1].start_mono_ns, t[0].start_mono_ns);
  EXPECT_EQ(t[1].after_step, kNoStep);
  EXPECT_EQ(t[2].name, "backward");
  EXPECT_EQ(t[2].start_mono_ns, t[0].start_mono_ns + t[0].duration_ns);
  EXPECT_EQ(t[3].kind, TimingKind::kCpu);
  EXPECT_EQ(t[4].name, "optimizer");
  EXPECT_EQ(t[4].after_step, kNoStep);
  EXPECT_EQ(t[5].kind, TimingKind::kCpu);
  EXPECT_EQ(t[6].kind, TimingKind::kStep);
  EXPECT_EQ(t[6].step, 10);
  EXPECT_EQ(t[6].after_step, kNoStep);
  EXPECT_EQ(t[6].start_mono_ns + t[6].duration_ns, t[4].start_mono_ns + t[4].duration_ns);
  EXPECT_EQ(t[7].name, "optimizer");
  EXPECT_EQ(t[7].after_step, 10);
  EXPECT_EQ(t[7].start_mono_ns, t[4].start_mono_ns + t[4].duration_ns);
  EXPECT_EQ(t[8].kind, TimingKind::kCpu);  // the rest of optimizer's CPU time, in the next step
  EXPECT_EQ(t[8].after_step, 10);
  EXPECT_EQ(t[9].name, "gc");
  EXPECT_EQ(t[9].kind, TimingKind::kPhase);  // not a compute phase: no CPU record
  EXPECT_EQ(t[10].kind, TimingKind::kGpu);
  EXPECT_EQ(t[10].duration_ns, 7);
  for (const auto& x : t) EXPECT_GE(x.duration_ns, 0);
  client::Shutdown();
  unsetenv(client::kStatusPageEnv);
  unlink(path.c_str());
}

// The number of the process's first step, as a restarted generation reports
// it: the script's own number where it reports steps right after the optimizer
// step that automatic counting saw; the automatic count's once a second step
// confirms it; never the automatic count's guess while the script may still
// renumber it.
class FirstStepTest : public testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::TempDir() + "/client_test_first_" + std::to_string(getpid());
    auto page = MappedStatusPage::Create(path_);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    page_ = std::move(page.value());
    setenv(client::kStatusPageEnv, path_.c_str(), 1);
    ASSERT_TRUE(client::Init());
  }
  void TearDown() override {
    client::Shutdown();
    unsetenv(client::kStatusPageEnv);
    unlink(path_.c_str());
  }
  StatusSnapshot Read() { return ReadStatusPage(*page_.get()); }

  std::string path_;
  MappedStatusPage page_;
};

TEST_F(FirstStepTest, TheScriptsOwnNumberReplacesTheAutomaticCountsGuess) {
  client::AutomaticStep(0);  // a resumed script's first optimizer step, counted from 0
  EXPECT_EQ(Read().first_step, kNoStep) << "not settled while the script may still number it";
  EXPECT_GT(Read().first_step_mono_ns, 0);
  client::Step(11);          // the script: that was step 11 (it resumed from 10)
  StatusSnapshot s = Read();
  EXPECT_EQ(s.first_step, 11);
  EXPECT_EQ(s.step, 11);
  EXPECT_EQ(s.step_count, 1);
  client::AutomaticStep(1);  // ignored from now on
  client::Step(12);
  s = Read();
  EXPECT_EQ(s.first_step, 11);
  EXPECT_EQ(s.step, 12);
  EXPECT_EQ(s.step_count, 2);
}

TEST_F(FirstStepTest, AutomaticCountingSettlesAtItsSecondStep) {
  client::AutomaticStep(41);  // resumed after a recognised checkpoint of step 40
  EXPECT_EQ(Read().first_step, kNoStep);
  client::AutomaticStep(42);
  EXPECT_EQ(Read().first_step, 41);
  client::Step(50);  // a script that reports only now and then: the first stays
  EXPECT_EQ(Read().first_step, 41);
  EXPECT_EQ(Read().step, 50);
}

TEST_F(FirstStepTest, AScriptThatNumbersItsStepsSettlesAtOnce) {
  client::Step(7);
  EXPECT_EQ(Read().first_step, 7);
  client::Step(8);
  EXPECT_EQ(Read().first_step, 7);
}

TEST_F(FirstStepTest, AutomaticStepsBeforeTheScriptsFirstCountBackFromIt) {
  client::AutomaticStep(0);
  client::AutomaticStep(1);  // settled: 0
  client::Step(2);
  EXPECT_EQ(Read().first_step, 0);
  EXPECT_EQ(Read().step_count, 2);
}

TEST(ClientTest, RejectsAPageOfAnotherVersion) {
  std::string path = testing::TempDir() + "/client_test_badpage_" + std::to_string(getpid());
  {
    auto page = MappedStatusPage::Create(path);
    ASSERT_TRUE(page.ok());
    page->get()->version = kStatusPageVersion + 1;
  }
  setenv(client::kStatusPageEnv, path.c_str(), 1);
  EXPECT_FALSE(client::Init());
  unsetenv(client::kStatusPageEnv);
  unlink(path.c_str());
}

}  // namespace
}  // namespace trainguard
