// Unit tests of commit.h: which save of a step is visible, and retirement.
// The engine's part (every rank writing into its save's directory) is driven
// through CheckpointEngine with several ranks as several engines.
#include "checkpoint/commit.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;

class CommitTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/commit_test_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<CheckpointEngine> Engine(double commit_timeout_s = 30, int keep_last = 3) {
    CheckpointOptions o;
    o.dir = dir_;
    o.report_to_trainguard = false;
    o.commit_timeout_s = commit_timeout_s;
    o.keep_last = keep_last;
    auto e = CheckpointEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(e.value());
  }

  // Rank `rank` of a DDP group of `world` saves `step` in save (attempt, seq);
  // every byte of the state is `fill`.
  void Save(CheckpointEngine& e, int rank, int world, std::int64_t step, const std::string& attempt,
            std::int64_t seq, char fill) {
    std::vector<char> a(300000, fill);
    SaveRequest req;
    req.step = step;
    req.rank = rank;
    req.world_size = world;
    for (int r = 0; r < world; ++r) req.replica_group.push_back(r);
    req.attempt = attempt;
    req.sequence = seq;
    req.blob = std::string(1, fill);
    req.tensors = {{"a", "u8", {300000}, a.data(), a.size()}};
    ASSERT_TRUE(e.Save(req).ok());
  }

  // The step's whole stream, read from every rank's part of the committed save.
  std::vector<char> ReadStream(std::int64_t step, int world) {
    std::vector<char> stream;
    for (int r = 0; r < world; ++r) {
      auto m = ReadManifest(dir_, step, r);
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      if (!m.ok()) return {};
      stream.resize(m->total_bytes);
      Status s = ReadStoredRange(dir_, *m, stream.data() + m->lo, m->hi - m->lo);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    return stream;
  }

  // True if the blob and every byte of the tensor are `fill`.
  bool AllBytesAre(const std::vector<char>& stream, char fill) {
    auto m = ReadManifest(dir_, 30, 0);
    if (!m.ok() || stream.size() != m->total_bytes) return false;
    if (stream[m->blob_offset] != fill) return false;
    const TensorLayout& t = m->tensors[0];
    for (std::uint64_t i = 0; i < t.nbytes; ++i) {
      if (stream[t.offset + i] != fill) return false;
    }
    return true;
  }

  std::string StepDir(std::int64_t step) { return dir_ + "/" + StepDirName(step); }

  std::string dir_;
};

// The issue's scenario: rank 0 of attempt A dies before its part of step 30;
// ranks 1-3 wrote theirs. Attempt B saves step 30 again; rank 0 of B is first.
TEST_F(CommitTest, DebrisOfACrashedAttemptIsNeverCommittedWithANewSave) {
  constexpr int kWorld = 4;
  for (int r = 1; r < kWorld; ++r) {
    auto e = Engine(/*commit_timeout_s=*/0.05);
    Save(*e, r, kWorld, 30, "A", 2, 'a');
    ASSERT_TRUE(e->Wait().ok());
    EXPECT_EQ(e->stats().abandoned, 1);
  }
  std::vector<std::unique_ptr<CheckpointEngine>> b;
  for (int r = 0; r < kWorld; ++r) b.push_back(Engine());
  Save(*b[0], 0, kWorld, 30, "B", 0, 'b');
  // Rank 0's manifest of B is durable once its save directory holds it.
  std::string manifest0 = StepDir(30) + "/save-B-0/rank-00000.json";
  for (int i = 0; i < 10000 && !fs::exists(manifest0); ++i) usleep(1000);
  ASSERT_TRUE(fs::exists(manifest0));
  EXPECT_EQ(*CommitIfComplete(StepDir(30), 30, {"B", 0}, kWorld, 0), CommitResult::kWaiting);
  EXPECT_FALSE(ReadManifest(dir_, 30, 0).ok());  // four manifests of A and B: not a commit
  for (int r = 1; r < kWorld; ++r) Save(*b[r], r, kWorld, 30, "B", 0, 'b');
  for (auto& e : b) ASSERT_TRUE(e->Wait().ok());
  EXPECT_EQ(b[0]->stats().last_committed_step, 30);
  EXPECT_TRUE(AllBytesAre(ReadStream(30, kWorld), 'b'));
  EXPECT_TRUE(VerifyCheckpoint(dir_, 30).ok());
  EXPECT_FALSE(fs::exists(StepDir(30) + "/save-A-2"));  // debris removed after the commit
}

TEST_F(CommitTest, ASavedAgainStepIsReplacedWholeAndAReaderOfTheOldSaveIsStopped) {
  auto r0 = Engine(), r1 = Engine();
  Save(*r0, 0, 2, 30, "A", 0, 'a');
  Save(*r1, 1, 2, 30, "A", 0, 'a');
  ASSERT_TRUE(r0->Wait().ok() && r1->Wait().ok());
  auto old_manifest = ReadManifest(dir_, 30, 1);
  ASSERT_TRUE(old_manifest.ok());
  EXPECT_EQ(old_manifest->attempt, "A");
  // A restart saves step 30 again with other contents; until every rank of it
  // is durable, readers get A whole.
  auto n0 = Engine(), n1 = Engine();
  Save(*n0, 0, 2, 30, "B", 0, 'b');
  std::string manifest0 = StepDir(30) + "/save-B-0/rank-00000.json";
  for (int i = 0; i < 10000 && !fs::exists(manifest0); ++i) usleep(1000);
  EXPECT_TRUE(AllBytesAre(ReadStream(30, 2), 'a'));
  Save(*n1, 1, 2, 30, "B", 0, 'b');
  ASSERT_TRUE(n0->Wait().ok() && n1->Wait().ok());
  EXPECT_TRUE(AllBytesAre(ReadStream(30, 2), 'b'));
  EXPECT_FALSE(fs::exists(StepDir(30) + "/save-A-0"));
  std::vector<char> buf(old_manifest->hi - old_manifest->lo);
  EXPECT_EQ(ReadStoredRange(dir_, *old_manifest, buf.data(), buf.size()).code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(CommitTest, AnEarlierSaveOfTheSameAttemptDoesNotReplaceALaterCommit) {
  auto e = Engine();
  Save(*e, 0, 1, 30, "A", 5, 'x');
  ASSERT_TRUE(e->Wait().ok());
  fs::create_directories(StepDir(30) + "/save-A-3");
  EXPECT_EQ(*CommitIfComplete(StepDir(30), 30, {"A", 3}, 1, 0), CommitResult::kSuperseded);
  EXPECT_EQ(ReadManifest(dir_, 30, 0)->sequence, 5);
}

TEST_F(CommitTest, AManifestNamingAnotherSaveIsNotCommitted) {
  auto e = Engine();
  Save(*e, 0, 1, 30, "A", 0, 'x');
  ASSERT_TRUE(e->Wait().ok());
  fs::create_directories(StepDir(30) + "/save-C-0");
  fs::copy_file(StepDir(30) + "/save-A-0/rank-00000.json", StepDir(30) + "/save-C-0/rank-00000.json");
  auto r = CommitIfComplete(StepDir(30), 30, {"C", 0}, 1, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("belongs to another save"), std::string::npos);
  EXPECT_EQ(ReadManifest(dir_, 30, 0)->attempt, "A");
}

TEST_F(CommitTest, AStepIsRetiredByOneRenameAndAnInterruptedRetirementStaysInvisible) {
  auto e = Engine(30, /*keep_last=*/1);
  Save(*e, 0, 1, 10, "A", 0, 'x');
  ASSERT_TRUE(e->Wait().ok());
  Save(*e, 0, 1, 20, "A", 1, 'x');
  ASSERT_TRUE(e->Wait().ok());
  auto list = ListCheckpoints(dir_);
  ASSERT_EQ(list->size(), 1u);  // step 10 retired
  EXPECT_EQ((*list)[0].step, 20);
  // A crash right after the rename, before the files were deleted.
  fs::rename(StepDir(20), dir_ + "/.retiring-step-000000000020-0123");
  list = ListCheckpoints(dir_);
  EXPECT_TRUE(list->empty());
  Save(*e, 0, 1, 30, "A", 2, 'x');
  ASSERT_TRUE(e->Wait().ok());
  EXPECT_FALSE(fs::exists(dir_ + "/.retiring-step-000000000020-0123"));  // cleaned up
  ASSERT_TRUE(RetireStep(dir_, "step-000000000030").ok());
  EXPECT_TRUE(ListCheckpoints(dir_)->empty());
  EXPECT_TRUE(RetireStep(dir_, "step-000000000030").ok());  // already gone
}

TEST_F(CommitTest, RetentionKeepsTheNewestVerifiedStepBesidesTheNewest) {
  auto e = Engine(30, /*keep_last=*/10);
  for (int i = 0; i < 8; ++i) {
    Save(*e, 0, 1, 10 * (i + 1), "A", i, 'x');
    ASSERT_TRUE(e->Wait().ok());
  }
  auto steps = [&] {
    std::vector<std::int64_t> out;
    auto listed = ListCheckpoints(dir_);  // kept: a range-for over *ListCheckpoints() would dangle
    for (const auto& c : *listed) out.push_back(c.step);
    std::sort(out.begin(), out.end());
    return out;
  };
  ASSERT_EQ(steps().size(), 8u);
  // The controller verified the state through step 25 (replicas agreed, no NaN): step 20 stays too.
  ASSERT_TRUE(Retain(dir_, 80, SaveId{"A", 7}, 2, 25).ok());
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{20, 70, 80}));
  ASSERT_TRUE(Retain(dir_, 80, SaveId{"A", 7}, 2, 75).ok());  // 70 is both
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{70, 80}));
  ASSERT_TRUE(Retain(dir_, 80, SaveId{"A", 7}, 1, -2).ok());  // nothing verified yet: the oldest stays
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{70, 80}));
  ASSERT_TRUE(Retain(dir_, 80, SaveId{"A", 7}, 1, -1).ok());  // no verification: keep_last alone
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{80}));
}

TEST_F(CommitTest, ACommittedStepWithAMissingPartIsListedDamagedNotComplete) {
  auto e = Engine();
  Save(*e, 0, 1, 30, "A", 0, 'x');
  ASSERT_TRUE(e->Wait().ok());
  ASSERT_TRUE((*ListCheckpoints(dir_))[0].complete);
  fs::remove(StepDir(30) + "/save-A-0/rank-00000.data");
  auto info = (*ListCheckpoints(dir_))[0];
  EXPECT_TRUE(info.committed);
  EXPECT_FALSE(info.complete);
  EXPECT_NE(info.problem.find("rank-00000.data is missing"), std::string::npos) << info.problem;
}

TEST_F(CommitTest, SaveIdentitiesAreCheckedAndNeverReused) {
  auto e = Engine();
  char x = 1;
  SaveRequest req;
  req.world_size = 2;
  req.tensors = {{"x", "u8", {1}, &x, 1}};
  Status s = e->Save(req);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("attempt identity"), std::string::npos);
  req.attempt = "bad/name";
  EXPECT_EQ(e->Save(req).code(), StatusCode::kInvalidArgument);
  req.world_size = 1;
  req.attempt = "A";
  ASSERT_TRUE(e->Save(req).ok());
  ASSERT_TRUE(e->Wait().ok());
  ASSERT_TRUE(e->Save(req).ok());   // the same identity again: refused in phase 2
  s = e->Wait();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("used before"), std::string::npos) << s.message();
  EXPECT_TRUE(VerifyCheckpoint(dir_, 0).ok());  // the committed save is untouched
}

TEST_F(CommitTest, AStepWithACommitOfAnotherVersionIsListedAsSuchAndNeverDeleted) {
  fs::create_directories(StepDir(10));
  std::ofstream(StepDir(10) + "/COMMIT.json")
      << R"({"format": "trainguard-checkpoint", "version": 1, "step": 10, "world_size": 1})";
  auto e = Engine(30, /*keep_last=*/1);
  Save(*e, 0, 1, 20, "A", 0, 'x');
  ASSERT_TRUE(e->Wait().ok());
  auto list = ListCheckpoints(dir_);
  ASSERT_EQ(list->size(), 2u);  // retention left step 10 alone
  const CheckpointInfo& old = (*list)[1];
  EXPECT_FALSE(old.committed);
  EXPECT_NE(old.problem.find("format version 1"), std::string::npos) << old.problem;
}

TEST(SaveIdTest, DirectoryNamesRoundTripAndOthersAreRejected) {
  SaveId id{"0a1b2c_Z", 42}, parsed;
  ASSERT_TRUE(ParseSaveDirName(id.DirName(), &parsed));
  EXPECT_EQ(parsed, id);
  for (const char* bad : {"save-", "save-A", "save-A-", "save--1", "save-A-01", "save-A-x",
                          "save-a.b-1", "rank-00000.json", "save-A-1-"}) {
    EXPECT_FALSE(ParseSaveDirName(bad, &parsed)) << bad;
  }
}

}  // namespace
}  // namespace trainguard
