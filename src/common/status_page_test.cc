#include "common/status_page.h"

#include <gtest/gtest.h>

#include <chrono>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <string>
#include <thread>

#include "testing/scratch_dir.h"

namespace trainguard {
namespace {

TEST(StatusPageTest, APagesNameCarriesItsAgentsPid) {
  EXPECT_EQ(StatusPageName("job-7", "node0", 4242, 3), "trainguard-job-7-node0-4242-r3");
  EXPECT_EQ(StatusPageAgent("trainguard-job-7-node0-4242-r3"), 4242);
  EXPECT_EQ(StatusPageAgent(StatusPageName("a-1-r2", "n-5", 17, 12)), 17);  // dashes and digits in the ids
  EXPECT_EQ(StatusPageAgent("trainguard-job-node0-r3"), 0);         // the old name: no agent in it
  EXPECT_EQ(StatusPageAgent("trainguard-job-node0-4242-checkpoints"), 0);
  EXPECT_EQ(StatusPageAgent("trainguard-job-node0-4242-r"), 0);
  EXPECT_EQ(StatusPageAgent("other-job-node0-4242-r3"), 0);
  EXPECT_EQ(StatusPageAgent("trainguard-job-node0-99999999999-r3"), 0);  // not a pid
}

TEST(StatusPageTest, OnlyAPageNobodyHoldsIsRemovedAsStale) {
  testutil::ScratchDir scratch("status_page_test");
  const std::string dir = scratch.path();
  const std::string held = dir + "/" + StatusPageName("j", "n0", 100, 0);
  const std::string left = dir + "/" + StatusPageName("j", "n0", 101, 1);
  const std::string other = dir + "/" + StatusPageName("k", "n0", 102, 0);
  auto live = MappedStatusPage::Create(held);
  ASSERT_TRUE(live.ok());
  {
    auto gone = MappedStatusPage::Create(left);  // its creator ends: the lock goes with it
    ASSERT_TRUE(gone.ok());
    auto also = MappedStatusPage::Create(other);
    ASSERT_TRUE(also.ok());
  }
  // A process that was killed holds nothing either: a child creates a page and dies by SIGKILL.
  const std::string killed = dir + "/" + StatusPageName("j", "n1", 103, 2);
  pid_t child = fork();
  if (child == 0) {
    auto page = MappedStatusPage::Create(killed);
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(RemoveStalePages(dir, "trainguard-j-"), 2);
  EXPECT_TRUE(std::filesystem::exists(held));
  EXPECT_FALSE(std::filesystem::exists(left));
  EXPECT_FALSE(std::filesystem::exists(killed));
  EXPECT_TRUE(std::filesystem::exists(other));  // another job's: not asked
  // A sweep over other agents' pages leaves those written lately (one
  // being made is not locked yet for an instant).
  const std::string fresh = dir + "/" + StatusPageName("k", "n2", 104, 0);
  { auto page = MappedStatusPage::Create(fresh); ASSERT_TRUE(page.ok()); }
  EXPECT_EQ(RemoveStalePages(dir, "trainguard-", 10), 0);
  std::filesystem::last_write_time(fresh, std::filesystem::file_time_type::clock::now() - std::chrono::seconds(20));
  EXPECT_EQ(RemoveStalePages(dir, "trainguard-", 10), 1);
  EXPECT_FALSE(std::filesystem::exists(fresh));
  EXPECT_TRUE(std::filesystem::exists(held));
  live = MappedStatusPage();                     // the holder lets go
  EXPECT_TRUE(RemoveIfStale(held));
}

TEST(StatusPageTest, FreshPageHasNoProgress) {
  StatusPage page;
  InitStatusPage(&page);
  StatusSnapshot s = ReadStatusPage(page);
  EXPECT_FALSE(s.attached);
  EXPECT_EQ(s.step, kNoStep);
  EXPECT_EQ(s.checkpoint_step, kNoStep);
  EXPECT_EQ(s.phase, "");
}

TEST(StatusPageTest, LongPhaseNamesAreTruncated) {
  StatusPage page;
  InitStatusPage(&page);
  WritePhase(&page, std::string(200, 'x').c_str(), 5);
  StatusSnapshot s = ReadStatusPage(page);
  EXPECT_EQ(s.phase, std::string(kPhaseNameCapacity - 1, 'x'));
  EXPECT_EQ(s.phase_mono_ns, 5);
}

TEST(StatusPageTest, ReaderNeverSeesATornPhaseName) {
  StatusPage page;
  InitStatusPage(&page);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop.load(); ++i) WritePhase(&page, i % 2 ? "aaaaaaaaaaaa" : "bb", i);
  });
  for (int i = 0; i < 20000; ++i) {
    std::string p = ReadStatusPage(page).phase;
    ASSERT_TRUE(p == "" || p == "aaaaaaaaaaaa" || p == "bb") << p;
  }
  stop = true;
  writer.join();
}

TEST(StatusPageTest, OpenRejectsMissingAndShortFiles) {
  EXPECT_EQ(MappedStatusPage::Open("/nonexistent/page").status().code(), StatusCode::kIoError);
  testutil::ScratchDir dir("status_page_test");
  std::string path = dir / "short_page";
  FILE* f = fopen(path.c_str(), "w");
  fputs("x", f);
  fclose(f);
  EXPECT_EQ(MappedStatusPage::Open(path).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainguard
