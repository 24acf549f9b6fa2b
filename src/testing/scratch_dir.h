// A directory of a test's own under the test temp dir (TEST_TMPDIR, else
// /tmp), removed with everything in it when the object goes: a test leaves no
// files behind (docs/testing.md, "Hygiene"), even when an ASSERT returns early.
//
//   testutil::ScratchDir dir("event_store_test");
//   std::string db = dir.path() + "/store.db";   // and its -wal, -shm go too
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace trainguard::testutil {

class ScratchDir {
 public:
  // `stem` names the directory, for whoever reads a listing of /tmp.
  explicit ScratchDir(const std::string& stem) {
    std::string pattern = ::testing::TempDir() + "/" + stem + ".XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern << " failed";
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // A path inside the directory.
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace trainguard::testutil
