#include "trainguard/client.h"

#include <gtest/gtest.h>
#include <stdlib.h>
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

  StatusSnapshot s = ReadStatusPage(*page->get());
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.step_count, 2);
  EXPECT_GT(s.first_step_mono_ns, 0);
  EXPECT_GE(s.last_step_mono_ns, s.first_step_mono_ns);
  EXPECT_EQ(s.phase, "backward");
  EXPECT_EQ(s.checkpoint_step, 5);
  EXPECT_EQ(s.checkpoint_blocked_ns, 2000);

  client::Shutdown();
  client::Step(100);
  EXPECT_EQ(ReadStatusPage(*page->get()).step, 7);
  unsetenv(client::kStatusPageEnv);
  unlink(path.c_str());
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
