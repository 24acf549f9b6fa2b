#include "trainguard/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/layout.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/ckpt_test_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<CheckpointEngine> Engine(CheckpointOptions o = {}) {
    o.dir = dir_;
    o.report_to_trainguard = false;
    auto e = CheckpointEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return std::move(e.value());
  }

  // Deterministic contents for tensor `i` of `n` bytes.
  static std::vector<char> Bytes(int i, size_t n) {
    std::vector<char> v(n);
    std::mt19937 gen(i * 7919 + 1);
    for (auto& c : v) c = static_cast<char>(gen());
    return v;
  }

  // Reassembles a replica group's stream from every member's stored range.
  std::vector<char> ReadStream(std::int64_t step, const std::vector<int>& ranks) {
    auto m0 = ReadManifest(dir_, step, ranks[0]);
    EXPECT_TRUE(m0.ok()) << m0.status().ToString();
    std::vector<char> stream(m0->total_bytes);
    for (int r : ranks) {
      auto m = ReadManifest(dir_, step, r);
      EXPECT_TRUE(m.ok());
      Status s = ReadStoredRange(dir_, *m, stream.data() + m->lo, m->hi - m->lo);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    return stream;
  }

  // The directory of the save that step's commit names.
  std::string SaveDir(std::int64_t step) {
    auto list = ListCheckpoints(dir_);
    EXPECT_TRUE(list.ok());
    for (const auto& c : *list) {
      if (c.step == step) return c.path + "/" + c.save;
    }
    ADD_FAILURE() << "no step " << step;
    return "";
  }

  std::string dir_;
};

TEST_F(CheckpointTest, RoundTripsDtypesShapesZeroSizeAndTheBlob) {
  auto engine = Engine();
  std::vector<size_t> sizes = {0, 1, 3, 64, 1000, 5u << 20, 0, 7};
  std::vector<std::vector<char>> data;
  SaveRequest req;
  req.step = 42;
  req.blob = "pickled skeleton";
  const char* dtypes[] = {"float32", "int8", "bfloat16", "float64", "int64", "uint8", "bool", "int16"};
  for (size_t i = 0; i < sizes.size(); ++i) {
    data.push_back(Bytes(static_cast<int>(i), sizes[i]));
    req.tensors.push_back({"t" + std::to_string(i), dtypes[i],
                           {static_cast<std::int64_t>(sizes[i]), 1}, data.back().data(), sizes[i]});
  }
  ASSERT_TRUE(engine->Save(req).ok());
  // Phase 1 is done: the caller may scribble over its tensors now.
  for (auto& d : data) std::fill(d.begin(), d.end(), 0);
  ASSERT_TRUE(engine->Wait().ok());
  EXPECT_EQ(engine->stats().last_committed_step, 42);

  auto list = ListCheckpoints(dir_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_TRUE((*list)[0].committed);
  auto m = ReadManifest(dir_, 42, 0);
  ASSERT_TRUE(m.ok());
  std::vector<char> stream = ReadStream(42, {0});
  EXPECT_EQ(std::string(stream.data() + m->blob_offset, m->blob_nbytes), "pickled skeleton");
  ASSERT_EQ(m->tensors.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const TensorLayout& t = m->tensors[i];
    EXPECT_EQ(t.dtype, dtypes[i]);
    EXPECT_EQ(t.offset % kTensorAlignment, 0u);
    ASSERT_EQ(t.nbytes, sizes[i]);
    std::vector<char> expect = Bytes(static_cast<int>(i), sizes[i]);
    EXPECT_EQ(std::memcmp(stream.data() + t.offset, expect.data(), sizes[i]), 0) << t.name;
  }
  EXPECT_TRUE(VerifyCheckpoint(dir_, 42).ok());
}

TEST_F(CheckpointTest, AReplicaGroupStoresItsStateOnceSplitAcrossMembers) {
  constexpr int kReplicas = 4;
  std::vector<char> a = Bytes(1, 10u << 20), b = Bytes(2, 3u << 20);
  std::vector<std::unique_ptr<CheckpointEngine>> engines;
  for (int r = 0; r < kReplicas; ++r) engines.push_back(Engine());
  for (int r = 0; r < kReplicas; ++r) {
    SaveRequest req;
    req.step = 5;
    req.rank = r;
    req.world_size = kReplicas;
    req.attempt = "a";
    req.replica_group = {0, 1, 2, 3};
    req.blob = "b";
    req.tensors = {{"a", "u8", {10}, a.data(), a.size()}, {"b", "u8", {3}, b.data(), b.size()}};
    ASSERT_TRUE(engines[r]->Save(req).ok());
  }
  std::uint64_t written = 0;
  for (auto& e : engines) {
    ASSERT_TRUE(e->Wait().ok());
    written += e->stats().bytes_written;
    EXPECT_LE(e->stats().bytes_written, (13u << 20) / kReplicas + kRangeAlignment);
  }
  auto m = ReadManifest(dir_, 5, 0);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(written, m->total_bytes);  // once in total, not 4 times
  std::vector<char> stream = ReadStream(5, {0, 1, 2, 3});
  EXPECT_EQ(std::memcmp(stream.data() + m->tensors[0].offset, a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(stream.data() + m->tensors[1].offset, b.data(), b.size()), 0);
}

TEST_F(CheckpointTest, AStepIsInvisibleUntilEveryRankIsDurable) {
  CheckpointOptions o;
  o.commit_timeout_s = 0.3;
  auto rank0 = Engine(o);
  std::vector<char> a = Bytes(1, 1000);
  SaveRequest req;
  req.step = 9;
  req.world_size = 2;
  req.attempt = "a";
  req.tensors = {{"a", "u8", {1000}, a.data(), a.size()}};
  ASSERT_TRUE(rank0->Save(req).ok());
  ASSERT_TRUE(rank0->Wait().ok());  // returns once the step is abandoned
  EXPECT_EQ(rank0->stats().abandoned, 1);
  EXPECT_EQ(rank0->stats().last_committed_step, -1);
  auto list = ListCheckpoints(dir_);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_FALSE((*list)[0].committed);
  EXPECT_EQ(ReadManifest(dir_, 9, 0).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, AFlippedByteIsDetected) {
  auto engine = Engine();
  std::vector<char> a = Bytes(3, 1 << 20);
  SaveRequest req;
  req.step = 1;
  req.tensors = {{"a", "u8", {1 << 20}, a.data(), a.size()}};
  ASSERT_TRUE(engine->Save(req).ok());
  ASSERT_TRUE(engine->Wait().ok());
  std::string data = SaveDir(1) + "/" + RankFileStem(0) + ".data";
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(12345);
    char c;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(12345);
    f.write(&c, 1);
  }
  auto m = ReadManifest(dir_, 1, 0);
  std::vector<char> out(m->hi - m->lo);
  Status s = ReadStoredRange(dir_, *m, out.data(), out.size());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(data), std::string::npos);
  EXPECT_FALSE(VerifyCheckpoint(dir_, 1).ok());
}

TEST_F(CheckpointTest, AMissingRankShardMakesTheStepFailVerification) {
  auto r0 = Engine(), r1 = Engine();
  std::vector<char> a = Bytes(4, 4096);
  for (int r = 0; r < 2; ++r) {
    SaveRequest req;
    req.step = 3;
    req.rank = r;
    req.world_size = 2;
    req.attempt = "a";
  req.attempt = "a";
    req.tensors = {{"a", "u8", {4096}, a.data(), a.size()}};
    ASSERT_TRUE((r == 0 ? r0 : r1)->Save(req).ok());
  }
  ASSERT_TRUE(r0->Wait().ok());
  ASSERT_TRUE(r1->Wait().ok());
  ASSERT_TRUE(VerifyCheckpoint(dir_, 3).ok());
  fs::remove(SaveDir(3) + "/" + RankFileStem(1) + ".data");
  Status s = VerifyCheckpoint(dir_, 3);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank-00001.data"), std::string::npos) << s.message();
}

TEST_F(CheckpointTest, KeepsTheNewestKCheckpoints) {
  CheckpointOptions o;
  o.keep_last = 2;
  auto engine = Engine(o);
  std::vector<char> a = Bytes(5, 100);
  for (int step = 10; step <= 50; step += 10) {
    SaveRequest req;
    req.step = step;
    req.tensors = {{"a", "u8", {100}, a.data(), a.size()}};
    ASSERT_TRUE(engine->Save(req).ok());
    ASSERT_TRUE(engine->Wait().ok());
  }
  auto list = ListCheckpoints(dir_);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 50);
  EXPECT_EQ((*list)[1].step, 40);
}

TEST_F(CheckpointTest, ASaveWhileOneIsPersistingIsSkippedOrWaitsAsConfigured) {
  std::vector<char> big(256u << 20, 'x');
  for (auto policy : {OverflowPolicy::kSkip, OverflowPolicy::kBlock}) {
    CheckpointOptions o;
    o.overflow = policy;
    auto engine = Engine(o);
    SaveRequest req;
    req.tensors = {{"big", "u8", {1}, big.data(), big.size()}};
    req.step = policy == OverflowPolicy::kSkip ? 1 : 3;
    ASSERT_TRUE(engine->Save(req).ok());
    req.step += 1;
    Status second = engine->Save(req);
    ASSERT_TRUE(engine->Wait().ok());
    CheckpointStats st = engine->stats();
    if (policy == OverflowPolicy::kSkip) {
      EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(st.skipped, 1);
      EXPECT_EQ(st.last_committed_step, 1);
    } else {
      EXPECT_TRUE(second.ok());
      EXPECT_EQ(st.blocked, 1);
      EXPECT_GT(st.last_blocked_s, 0);
      EXPECT_EQ(st.last_committed_step, 4);
    }
  }
}

TEST_F(CheckpointTest, RoundTripsAStateLargerThanOneGiB) {
  std::vector<char> a(1100u << 20);
  for (size_t i = 0; i < a.size(); i += 4096) a[i] = static_cast<char>(i / 4096);
  auto engine = Engine();
  SaveRequest req;
  req.step = 7;
  req.tensors = {{"huge", "u8", {static_cast<std::int64_t>(a.size())}, a.data(), a.size()}};
  ASSERT_TRUE(engine->Save(req).ok());
  ASSERT_TRUE(engine->Wait().ok());
  auto m = ReadManifest(dir_, 7, 0);
  ASSERT_TRUE(m.ok());
  std::vector<char> out(m->hi - m->lo);
  ASSERT_TRUE(ReadStoredRange(dir_, *m, out.data(), out.size()).ok());
  EXPECT_EQ(std::memcmp(out.data() + m->tensors[0].offset, a.data(), a.size()), 0);
}

TEST_F(CheckpointTest, BadRequestsAreRejectedWithTheReason) {
  auto engine = Engine();
  char x = 0;
  SaveRequest dup;
  dup.tensors = {{"a", "u8", {1}, &x, 1}, {"a", "u8", {1}, &x, 1}};
  Status s = engine->Save(dup);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'a' appears twice"), std::string::npos);
  SaveRequest rank;
  rank.rank = 3;
  rank.world_size = 2;
  EXPECT_EQ(engine->Save(rank).code(), StatusCode::kInvalidArgument);
  SaveRequest group;
  group.world_size = 2;
  group.attempt = "a";
  group.replica_group = {1};
  EXPECT_EQ(engine->Save(group).code(), StatusCode::kInvalidArgument);
  SaveRequest device;
  device.tensors = {{"d", "f32", {1}, &x, 1, /*on_device=*/true}};
  EXPECT_EQ(engine->Save(device).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckpointEngine::Create({}).status().code(), StatusCode::kInvalidArgument);
}

TEST(CheckpointLayoutTest, MemberRangesCoverTheStreamExactlyOnce) {
  for (std::uint64_t total : {0ULL, 1ULL, 4095ULL, 4096ULL, 1000000ULL}) {
    for (int members : {1, 2, 3, 8}) {
      std::uint64_t expect_lo = 0;
      for (int i = 0; i < members; ++i) {
        auto [lo, hi] = MemberRange(total, members, i);
        EXPECT_EQ(lo, expect_lo);
        EXPECT_LE(lo, hi);
        expect_lo = hi;
      }
      EXPECT_EQ(expect_lo, total);
    }
  }
}

// Node memory copies (options.memory_dir): read from memory only when the
// copy is exactly the committed save's bytes, else from storage, saying why.
TEST_F(CheckpointTest, AMemoryCopyIsReadOnlyWhenItIsTheCommittedSavesExactBytes) {
  const std::string mem = dir_ + "-memory";
  fs::remove_all(mem);
  CheckpointOptions o;
  o.memory_dir = mem;
  o.memory_keep = 1;
  auto engine = Engine(o);
  std::vector<char> a = Bytes(1, 100000);
  auto save = [&](std::int64_t step) {
    for (auto& c : a) c = static_cast<char>(c + 1);
    SaveRequest req;
    req.step = step;
    req.blob = "b";
    req.tensors = {{"a", "u8", {static_cast<std::int64_t>(a.size())}, a.data(), a.size()}};
    ASSERT_TRUE(engine->Save(req).ok());
    ASSERT_TRUE(engine->Wait().ok());
  };
  save(10);
  save(20);
  // Only the newest committed step stays in memory.
  EXPECT_FALSE(fs::exists(mem + "/" + StepDirName(10)));
  const std::string save_dir = SaveDir(20);
  const std::string copy = mem + "/" + StepDirName(20) + "/" + fs::path(save_dir).filename().string() +
                           "/" + RankFileStem(0) + ".data";
  ASSERT_TRUE(fs::exists(copy));
  auto m = ReadManifest(dir_, 20, 0);
  ASSERT_TRUE(m.ok());
  auto read = [&](std::string* source, std::string* problem) {
    std::vector<char> out(m->hi - m->lo);
    Status s = ReadStoredRange(dir_, *m, out.data(), out.size(), 2, mem, source, problem);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  };
  std::string source, problem;
  std::vector<char> from_memory = read(&source, &problem);
  EXPECT_EQ(source, "memory");
  EXPECT_EQ(problem, "");
  auto mapped = MapMemoryCopy(dir_, *m, mem, 2);  // the same, without a copy
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  ASSERT_EQ(mapped->size, from_memory.size());
  EXPECT_EQ(std::memcmp(mapped->data, from_memory.data(), from_memory.size()), 0);
  static_cast<char*>(mapped->data)[0] ^= 1;  // private: the copy does not change
  munmap(mapped->data, mapped->size);
  // One flipped byte in the copy: storage, and why.
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5000);
    char c;
    f.get(c);
    f.seekp(5000);
    f.put(static_cast<char>(c ^ 1));
  }
  EXPECT_EQ(read(&source, &problem), from_memory);
  EXPECT_EQ(source, "storage");
  EXPECT_NE(problem.find("checksum"), std::string::npos) << problem;
  mapped = MapMemoryCopy(dir_, *m, mem, 2);
  ASSERT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("checksum mismatch"), std::string::npos) << mapped.status().ToString();
  // A copy of another save of the step: never looked at.
  fs::rename(fs::path(copy).parent_path(), fs::path(copy).parent_path().parent_path() / "s-other-1");
  EXPECT_EQ(read(&source, &problem), from_memory);
  EXPECT_EQ(source, "storage");
  EXPECT_NE(problem.find("another save of step 20"), std::string::npos) << problem;
  mapped = MapMemoryCopy(dir_, *m, mem, 2);
  EXPECT_EQ(mapped.status().code(), StatusCode::kNotFound);
  EXPECT_NE(mapped.status().message().find("another save of step 20"), std::string::npos);
  // No memory at all (a replacement node): storage, nothing to say.
  fs::remove_all(mem);
  EXPECT_EQ(read(&source, &problem), from_memory);
  EXPECT_EQ(source, "storage");
  EXPECT_EQ(problem, "");
}

}  // namespace
}  // namespace trainguard
