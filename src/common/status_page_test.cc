#include "common/status_page.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace trainguard {
namespace {

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
  std::string path = testing::TempDir() + "/short_page";
  FILE* f = fopen(path.c_str(), "w");
  fputs("x", f);
  fclose(f);
  EXPECT_EQ(MappedStatusPage::Open(path).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainguard
