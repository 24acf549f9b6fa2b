// Kill trials: ranks are real processes (fork) that save in a loop and are
// SIGKILLed at seeded random moments — during phase 1, phase 2, the commit or
// retention — one rank or all of them. After each trial the directory is
// checked as a restart would see it, and the next trial is a restart: a new
// attempt whose states differ from the last one's, resuming from the newest
// complete step (sometimes an older one), so it saves again steps that the
// killed attempt had partly written or committed.
//
// After every trial: every committed step is complete (no part missing),
// every step that ListCheckpoints calls complete passes VerifyCheckpoint, and its contents are exactly the state that the attempt
// named by its commit saved for that step, byte for byte (never a mix).
//
// TG_KILL_TRIALS (default 120) and TG_KILL_SEED (default: from the clock,
// printed) repeat or extend the run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "trainguard/checkpoint.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 3;
constexpr int kSavesPerAttempt = 6;
const std::vector<std::uint64_t> kTensorBytes = {256 << 10, (1 << 20) + 123, 64};

std::uint64_t Mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The state attempt `attempt` saves at `step`: every tensor differs between
// attempts and steps.
std::vector<std::vector<char>> StateOf(int attempt, std::int64_t step) {
  std::vector<std::vector<char>> tensors;
  for (size_t t = 0; t < kTensorBytes.size(); ++t) {
    std::vector<char> v(kTensorBytes[t]);
    std::uint64_t seed = Mix((static_cast<std::uint64_t>(attempt) << 40) ^ (step << 8) ^ t);
    for (size_t i = 0; i < v.size(); i += 8) {
      std::uint64_t w = Mix(seed + i);
      std::memcpy(v.data() + i, &w, std::min<size_t>(8, v.size() - i));
    }
    tensors.push_back(std::move(v));
  }
  return tensors;
}

std::string BlobOf(int attempt, std::int64_t step) {
  return "attempt " + std::to_string(attempt) + " step " + std::to_string(step);
}

std::string AttemptName(int attempt) { return "trial" + std::to_string(attempt); }

// One rank of attempt `attempt`: saves kSavesPerAttempt steps from `first_step`.
[[noreturn]] void RunRank(const std::string& dir, int attempt, int rank, std::int64_t first_step,
                          int keep_last) {
  CheckpointOptions o;
  o.dir = dir;
  o.keep_last = keep_last;
  o.writer_threads = 2;
  o.copy_threads = 1;
  o.commit_timeout_s = 5;
  o.report_to_trainguard = false;
  auto engine = CheckpointEngine::Create(o);
  if (!engine.ok()) _exit(3);
  for (int i = 0; i < kSavesPerAttempt; ++i) {
    std::int64_t step = first_step + 10 * i;
    auto state = StateOf(attempt, step);
    SaveRequest req;
    req.step = step;
    req.rank = rank;
    req.world_size = kWorld;
    for (int r = 0; r < kWorld; ++r) req.replica_group.push_back(r);
    req.attempt = AttemptName(attempt);
    req.sequence = i;
    req.blob = BlobOf(attempt, step);
    for (size_t t = 0; t < state.size(); ++t) {
      req.tensors.push_back({"t" + std::to_string(t), "u8",
                             {static_cast<std::int64_t>(state[t].size())}, state[t].data(),
                             state[t].size()});
    }
    if (!(*engine)->Save(req).ok()) _exit(4);
    if (i % 2 == 1 && !(*engine)->Wait().ok()) _exit(5);
  }
  _exit((*engine)->Wait().ok() ? 0 : 6);
}

// Checks one complete step: returns "" or what is wrong.
std::string CheckStep(const std::string& dir, const CheckpointInfo& info) {
  Status verified = VerifyCheckpoint(dir, info.step);
  if (!verified.ok()) return "listed complete but fails verification: " + verified.message();
  std::vector<char> stream;
  std::string attempt;
  for (int r = 0; r < kWorld; ++r) {
    auto m = ReadManifest(dir, info.step, r);
    if (!m.ok()) return "unloadable: " + m.status().message();
    if (r == 0) attempt = m->attempt;
    if (m->attempt != attempt) return "ranks' manifests name different attempts";
    stream.resize(m->total_bytes);
    Status s = ReadStoredRange(dir, *m, stream.data() + m->lo, m->hi - m->lo);
    if (!s.ok()) return "unloadable: " + s.message();
  }
  int which = std::atoi(attempt.c_str() + 5);
  auto m = ReadManifest(dir, info.step, 0);
  auto want = StateOf(which, info.step);
  if (std::string(stream.data() + m->blob_offset, m->blob_nbytes) != BlobOf(which, info.step)) {
    return "blob is not the one attempt " + std::to_string(which) + " saved";
  }
  for (size_t t = 0; t < want.size(); ++t) {
    const TensorLayout& l = m->tensors[t];
    if (l.nbytes != want[t].size() ||
        std::memcmp(stream.data() + l.offset, want[t].data(), want[t].size()) != 0) {
      return "MIXED: tensor " + l.name + " is not the one attempt " + std::to_string(which) +
             " saved";
    }
  }
  return "";
}

TEST(CheckpointKillTest, NoKillAtAnyMomentLeavesAMixedTornOrUnverifiableStep) {
  const char* trials_env = std::getenv("TG_KILL_TRIALS");
  const char* seed_env = std::getenv("TG_KILL_SEED");
  int trials = trials_env ? std::atoi(trials_env) : 120;
  std::uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10)
                                : static_cast<std::uint64_t>(
                                      std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("kill trials: %d, TG_KILL_SEED=%llu\n", trials, static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  std::string dir = testing::TempDir() + "/ckpt_kill_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);

  double full_run_s = 0;  // how long an attempt takes unkilled (trial 0 measures it)
  int kills_of_one = 0, kills_of_all = 0, restores = 0, resaved = 0;
  for (int trial = 0; trial < trials; ++trial) {
    auto list = ListCheckpoints(dir);
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    std::vector<std::int64_t> complete;
    for (const auto& c : *list) {
      if (c.complete) complete.push_back(c.step);
    }
    // Restart from the newest complete step, sometimes from the one before.
    std::int64_t from = -10;
    if (!complete.empty()) {
      from = complete.size() > 1 && rng() % 4 == 0 ? complete[1] : complete[0];
      ++restores;
    }
    std::int64_t first = from + 10;
    for (const auto& c : *list) {
      if (c.step >= first) ++resaved;  // this attempt saves that step again
    }
    int keep_last = 1 + static_cast<int>(rng() % 3);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<pid_t> pids;
    for (int r = 0; r < kWorld; ++r) {
      pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) RunRank(dir, trial, r, first, keep_last);
      pids.push_back(pid);
    }
    if (trial > 0) {
      std::uniform_real_distribution<double> when(0, full_run_s * 1.1);
      std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
      if (rng() % 2 == 0) {
        // One rank dies; the supervisor stops the others a moment later.
        kill(pids[rng() % kWorld], SIGKILL);
        std::uniform_real_distribution<double> later(0, 0.02);
        std::this_thread::sleep_for(std::chrono::duration<double>(later(rng)));
        ++kills_of_one;
      } else {
        ++kills_of_all;
      }
      for (pid_t p : pids) kill(p, SIGKILL);
    }
    for (pid_t p : pids) {
      int status = 0;
      ASSERT_EQ(waitpid(p, &status, 0), p);
      if (trial == 0) {
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
      }
    }
    if (trial == 0) {
      full_run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    list = ListCheckpoints(dir);
    ASSERT_TRUE(list.ok());
    for (const auto& c : *list) {
      ASSERT_EQ(c.committed, c.complete) << "trial " << trial << " step " << c.step
                                         << " is committed but torn: " << c.problem
                                         << "; repeat with TG_KILL_SEED=" << seed;
      if (!c.complete) continue;
      std::string problem = CheckStep(dir, c);
      ASSERT_EQ(problem, "") << "trial " << trial << " step " << c.step << " (" << c.save
                             << "); repeat with TG_KILL_SEED=" << seed;
    }
  }
  std::printf("kill trials: %d (one rank %d, all ranks %d), restarts from a checkpoint %d, "
              "steps saved again %d; unkilled attempt %.0f ms\n",
              trials, kills_of_one, kills_of_all, restores, resaved, full_run_s * 1000);
  EXPECT_GT(restores, trials / 2);  // the trials did exercise restarts
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainguard
