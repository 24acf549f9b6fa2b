#include "controller/straggler_detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

namespace trainguard {
namespace {

// The findings that name, clear or report a trend (not the baseline's).
std::vector<StragglerFinding> Named(std::vector<StragglerFinding> f) {
  f.erase(std::remove_if(f.begin(), f.end(), [](const StragglerFinding& x) { return x.kind == StragglerKind::kBaseline; }),
          f.end());
  return f;
}

// A job of `nodes` x 2 ranks; `slow(node, step)` scales a node's forward and
// backward, `comm(node, step)` its collectives; every value has +-`noise`
// uniform noise.
struct Job {
  int nodes = 4;
  double noise = 0.03;
  std::mt19937 rng{7};
  std::function<double(int, std::int64_t)> slow = [](int, std::int64_t) { return 1.0; };
  std::function<double(int, std::int64_t)> comm = [](int, std::int64_t) { return 1.0; };
  std::function<double(int, int, std::int64_t)> extra_gc = [](int, int, std::int64_t) { return 0.0; };
  // Microseconds rank r of node n waits for its data at a step (0: no data
  // phase); the others wait for the slowest in their all_reduce.
  std::function<double(int, int, std::int64_t)> data = [](int, int, std::int64_t) { return 0.0; };
  double idle_us = 0;  // added to every step outside any phase (a sleep, I/O)
  // With cpu_noise >= 0 the ranks also report their compute phases' CPU
  // time ("cpu:" keys): `work(node, step)` times the phase's, +-cpu_noise
  // (backward's +-30 %).
  double cpu_noise = -1;
  std::function<double(int, std::int64_t)> work = [](int, std::int64_t) { return 1.0; };
  // Evaluate() after the steps with step % evaluate_every == evaluate_at (as
  // heartbeats bring steps in batches), and after the last.
  int evaluate_every = 1;
  int evaluate_at = 0;
  // > 0: each node brings its ranks' steps `batch` at a time (a heartbeat's
  // worth), node n the first time after step batch + 4n (its agent came up
  // later: that first heartbeat brings every step so far), with an
  // Evaluate() after each node's batch (as the controller's on each
  // Timings message); evaluate_every is then unused.
  int batch = 0;
  bool keep_baseline = false;  // also return the kBaseline finding

  double Noisy(double v) { return v * std::uniform_real_distribution<double>(1 - noise, 1 + noise)(rng); }

  std::vector<StragglerFinding> Run(StragglerDetector* d, std::int64_t from, std::int64_t to) {
    std::vector<StragglerFinding> all;
    std::vector<std::vector<RankStep>> pending(static_cast<std::size_t>(nodes));  // with batch > 0: each node's unsent steps
    for (std::int64_t step = from; step < to; ++step) {
      double most_data = 0;
      for (int n = 0; n < nodes; ++n) {
        for (int r = 0; r < 2; ++r) most_data = std::max(most_data, data(n, r, step));
      }
      for (int n = 0; n < nodes; ++n) {
        for (int r = 0; r < 2; ++r) {
          RankStep s;
          s.node = "node" + std::to_string(n);
          s.rank = 2 * n + r;
          s.step = step;
          s.phases["forward"] = Noisy(30000 * slow(n, step));
          s.phases["backward"] = Noisy(60000 * slow(n, step));
          s.phases["optimizer"] = Noisy(5000);
          if (cpu_noise >= 0) {
            std::uniform_real_distribution<double> cpu(1 - cpu_noise, 1 + cpu_noise);
            s.phases["cpu:forward"] = 30000 * work(n, step) * cpu(rng);
            // Backward's includes DDP's all-reduce threads waiting for their peers: not judged.
            s.phases["cpu:backward"] = 60000 * work(n, step) * std::uniform_real_distribution<double>(0.7, 1.3)(rng);
            s.phases["cpu:optimizer"] = 5000 * cpu(rng);
          }
          s.phases["comm:all_reduce"] = Noisy(20000 * comm(n, step)) + most_data - data(n, r, step);
          if (most_data > 0) s.phases["data"] = Noisy(1000) + data(n, r, step);
          double gc = extra_gc(n, r, step);
          if (gc > 0) s.phases["gc"] = gc;
          s.step_us = s.phases["forward"] + s.phases["backward"] + s.phases["optimizer"] + 10000 + gc + most_data + idle_us;
          // The gradient all_reduce is entered when forward and backward are done.
          s.collectives.emplace_back(0, step + 1, step * 1e6 + s.phases["forward"] + s.phases["backward"]);
          FillSignals(&s);
          if (batch > 0) {
            pending[static_cast<std::size_t>(n)].push_back(s);
          } else {
            d->Add(s);
          }
        }
      }
      if (batch > 0) {
        for (int n = 0; n < nodes; ++n) {
          const std::int64_t first = batch + 4 * n;
          if ((step < first || (step - first) % batch != 0) && step + 1 < to) continue;
          for (const RankStep& s : pending[static_cast<std::size_t>(n)]) d->Add(s);
          pending[static_cast<std::size_t>(n)].clear();
          Collect(d, &all);
        }
        continue;
      }
      if (step % evaluate_every != evaluate_at && step + 1 < to) continue;
      Collect(d, &all);
    }
    return all;
  }

  void Collect(StragglerDetector* d, std::vector<StragglerFinding>* all) const {
    for (auto& f : d->Evaluate()) {
      if (f.kind != StragglerKind::kBaseline || keep_baseline) all->push_back(f);
    }
  }
};

TEST(StragglerDetectorTest, NamesTheSlowNodeOnlyAndWhenToEvict) {
  StragglerPolicy p;
  p.change_threshold = 1e9;  // the windows alone: the step-by-step test names it sooner (below)
  StragglerDetector d(p);
  Job job;
  job.slow = [](int n, std::int64_t) { return n == 2 ? 1.10 : 1.0; };
  auto f = job.Run(&d, 0, 100);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].kind, StragglerKind::kStraggler);
  EXPECT_EQ(f[0].node, "node2");
  EXPECT_EQ(f[0].signal, StragglerSignal::kCompute);
  EXPECT_FALSE(f[0].evict);
  // As early as the hysteresis allows after the first window (start-up).
  EXPECT_EQ(f[0].last_step, (p.windows_to_report + 1) * p.window_steps - 1);
  EXPECT_NEAR(f[0].slowdown, 0.10, 0.03);
  EXPECT_EQ(f[0].phase, "backward");  // 10 % of the longer phase is the larger gap
  EXPECT_TRUE(f[0].rank == 4 || f[0].rank == 5);
  EXPECT_NE(f[0].message.find("node node2 is a compute straggler"), std::string::npos) << f[0].message;
  EXPECT_GT(f[0].last_to_enter, 0.9);  // the others waited for it in nearly every all_reduce
  EXPECT_NE(f[0].message.find("last to enter"), std::string::npos) << f[0].message;
  EXPECT_TRUE(f[1].evict);
  EXPECT_EQ(f[1].last_step, (p.windows_to_evict + 1) * p.window_steps - 1);
  EXPECT_EQ(d.Stragglers(), std::set<std::string>{"node2"});
}

TEST(StragglerDetectorTest, ANodeThatSlowsBy10PercentMidRunIsNamedWithinFiveSteps) {
  StragglerPolicy p;
  StragglerDetector d(p);
  Job job;
  // From step 80 node 2 computes 10 % slower (forward and optimizer alike).
  job.slow = [](int n, std::int64_t step) { return n == 2 && step >= 80 ? 1.10 : 1.0; };
  auto f = job.Run(&d, 0, 100);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].kind, StragglerKind::kStraggler);
  EXPECT_EQ(f[0].node, "node2");
  EXPECT_FALSE(f[0].evict);  // eviction still takes the windows' evidence
  EXPECT_GE(f[0].first_step, 80);
  EXPECT_LE(f[0].last_step, 84) << f[0].message;  // within 5 steps of the change
  EXPECT_NE(f[0].message.find("since step " + std::to_string(f[0].first_step)), std::string::npos) << f[0].message;
  EXPECT_NE(f[0].message.find("(change point)"), std::string::npos) << f[0].message;
  EXPECT_EQ(d.Stragglers(), std::set<std::string>{"node2"});
  for (std::size_t i = 1; i < f.size(); ++i) EXPECT_NE(f[i].kind, StragglerKind::kStraggler) << f[i].message;  // named once
}

// `job` run `steps` steps with each of `seeds` seeds names nobody.
void ExpectNobodyNamed(Job job, unsigned seeds, std::int64_t steps) {
  for (unsigned seed = 1; seed <= seeds; ++seed) {
    StragglerDetector d(StragglerPolicy{});
    job.rng.seed(seed);
    auto found = job.Run(&d, 0, steps);
    EXPECT_TRUE(found.empty()) << "seed " << seed << ": " << (found.empty() ? "" : found[0].message);
  }
}

TEST(StragglerDetectorTest, NoiseAloneNamesNobody) {
  Job job;
  job.noise = 0.10;
  ExpectNobodyNamed(job, 20, 300);
}

// A CPU job on a crowded machine: each step's phases take anywhere from
// 0.8 to 1.2 times their time, while the CPU they use moves by 0.5 %.
Job CrowdedCpuJob() {
  Job job;
  job.noise = 0.20;
  job.cpu_noise = 0.005;
  return job;
}

TEST(StragglerDetectorTest, ARankThatComputesMoreIsNamedByItsCpuTimeThroughNoisyTimes) {
  for (unsigned seed = 1; seed <= 10; ++seed) {
    StragglerDetector d(StragglerPolicy{});
    Job job = CrowdedCpuJob();
    job.rng.seed(seed);
    // From step 80 node 2 computes 20 % more: its phases take 1.2 times as long, in time and in CPU.
    job.work = [](int n, std::int64_t step) { return n == 2 && step >= 80 ? 1.2 : 1.0; };
    job.slow = job.work;
    auto f = job.Run(&d, 0, 100);
    ASSERT_FALSE(f.empty()) << "seed " << seed;
    EXPECT_EQ(f[0].node, "node2") << f[0].message;
    EXPECT_EQ(f[0].measure, "cpu_time") << f[0].message;
    EXPECT_GE(f[0].first_step, 80) << f[0].message;
    EXPECT_LE(f[0].last_step, 84) << f[0].message;  // within 5 steps
    EXPECT_EQ(f[0].phase, "forward") << f[0].message;  // CPU-time phases, named without "cpu:"
    EXPECT_NEAR(f[0].slowdown, 41.0 / 35 - 1, 0.02) << f[0].message;  // forward 1.2x (36 ms), optimizer not (5 ms)
    EXPECT_NE(f[0].message.find("of CPU time per step"), std::string::npos) << f[0].message;
  }
  // The same job without CPU times: its times alone are too noisy to name it within 5 steps.
  StragglerDetector d(StragglerPolicy{});
  Job job = CrowdedCpuJob();
  job.cpu_noise = -1;
  job.slow = [](int n, std::int64_t step) { return n == 2 && step >= 80 ? 1.2 : 1.0; };
  auto f = job.Run(&d, 0, 85);
  EXPECT_TRUE(f.empty()) << f[0].message;
}

TEST(StragglerDetectorTest, ARankThatComputesMoreFromTheStartIsNamedWithinFifteenSteps) {
  for (unsigned seed = 1; seed <= 10; ++seed) {
    StragglerDetector d(StragglerPolicy{});
    Job job = CrowdedCpuJob();
    job.rng.seed(seed);
    job.work = [](int n, std::int64_t) { return n == 2 ? 1.2 : 1.0; };
    job.slow = job.work;
    auto f = job.Run(&d, 0, 40);
    ASSERT_FALSE(f.empty()) << "seed " << seed;
    EXPECT_EQ(f[0].node, "node2") << f[0].message;
    EXPECT_EQ(f[0].measure, "cpu_time") << f[0].message;
    EXPECT_LE(f[0].last_step, 15) << f[0].message;  // the first window (steps 0-9) is start-up
    EXPECT_NE(f[0].message.find("slower than its peers from the generation's start"), std::string::npos)
        << f[0].message;
    for (std::size_t i = 1; i < f.size(); ++i) EXPECT_NE(f[i].node, "node2") << f[i].message;  // named once
  }
}

TEST(StragglerDetectorTest, ANodeThatTakesLongerForTheSameWorkIsNamedByItsTime) {
  StragglerDetector d(StragglerPolicy{});
  Job job;
  job.cpu_noise = 0.005;
  // Throttled from step 80: node 2's phases take 1.3 times as long for the same CPU.
  job.slow = [](int n, std::int64_t step) { return n == 2 && step >= 80 ? 1.3 : 1.0; };
  auto f = job.Run(&d, 0, 100);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].node, "node2") << f[0].message;
  EXPECT_EQ(f[0].measure, "time") << f[0].message;
  EXPECT_LE(f[0].last_step, 84) << f[0].message;
  for (std::size_t i = 1; i < f.size(); ++i) EXPECT_NE(f[i].kind, StragglerKind::kStraggler) << f[i].message;
}

TEST(StragglerDetectorTest, CpuTimesAddNoFalseNamings) {
  Job job;
  job.cpu_noise = 0.01;
  ExpectNobodyNamed(job, 10, 1000);
}

TEST(StragglerDetectorTest, GarbageCollectionPausesAndACheckpointDoNotMakeAStraggler) {
  StragglerDetector d(StragglerPolicy{});
  Job job;
  // A 400 ms GC on one rank every 7th step, and node 1 three times slower for
  // the two steps of a checkpoint.
  job.extra_gc = [](int n, int r, std::int64_t step) { return n == 3 && r == 0 && step % 7 == 0 ? 400000.0 : 0.0; };
  job.slow = [](int n, std::int64_t step) { return n == 1 && (step == 40 || step == 41) ? 3.0 : 1.0; };
  EXPECT_TRUE(job.Run(&d, 0, 200).empty());
}

TEST(StragglerDetectorTest, TellsACommunicationStragglerFromAComputeOne) {
  StragglerDetector d(StragglerPolicy{});
  Job job;
  job.comm = [](int n, std::int64_t) { return n == 1 ? 1.5 : 1.0; };
  auto f = job.Run(&d, 0, 50);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].node, "node1");
  EXPECT_EQ(f[0].signal, StragglerSignal::kCommunication);
  EXPECT_EQ(f[0].phase, "comm:all_reduce");
}

TEST(StragglerDetectorTest, ClearsANodeThatKeepsPaceAgainAndResetsOnANewGeneration) {
  StragglerPolicy p;
  StragglerDetector d(p);
  Job job;
  job.slow = [](int n, std::int64_t step) { return n == 0 && step < 60 ? 1.2 : 1.0; };
  auto f = job.Run(&d, 0, 100);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f.front().kind, StragglerKind::kStraggler);
  EXPECT_EQ(f.back().kind, StragglerKind::kCleared);
  EXPECT_EQ(f.back().node, "node0");
  EXPECT_TRUE(d.Stragglers().empty());
  d.Reset(8);
  // Steps from a checkpoint again (a restart): judged afresh, nothing stale.
  EXPECT_TRUE(job.Run(&d, 100, 150).empty());
}

// Heartbeats bring steps in batches: the change-point test names a node at
// a step whose batch also completes an earlier, normal window. That window
// was evidence the naming already had: it must not clear it (it once did,
// with a clear at step 49 for a naming at step 54).
TEST(StragglerDetectorTest, AClearNeverPrecedesTheNamingItClears) {
  StragglerPolicy p;
  for (unsigned seed = 1; seed <= 5; ++seed) {
    StragglerDetector d(p);
    Job job;
    job.rng.seed(seed);
    job.evaluate_every = 10;
    job.evaluate_at = 5;
    job.slow = [](int n, std::int64_t step) { return n == 2 && step >= 50 ? 1.3 : 1.0; };
    auto f = job.Run(&d, 0, 120);
    ASSERT_FALSE(f.empty()) << "seed " << seed;
    EXPECT_EQ(f[0].kind, StragglerKind::kStraggler);
    EXPECT_EQ(f[0].node, "node2");
    EXPECT_NE(f[0].message.find("(change point)"), std::string::npos) << f[0].message;
    for (const StragglerFinding& x : f) {
      EXPECT_NE(x.kind, StragglerKind::kCleared) << "seed " << seed << ": " << x.message;  // slow throughout
      EXPECT_EQ(x.first_step, f[0].first_step) << x.message;  // one naming, one first step
    }
    EXPECT_EQ(d.Stragglers(), std::set<std::string>{"node2"});
    // It recovers: cleared by windows after the naming, saying which.
    job.slow = [](int, std::int64_t) { return 1.0; };
    auto g = job.Run(&d, 120, 200);
    ASSERT_FALSE(g.empty()) << "seed " << seed;
    EXPECT_EQ(g.back().kind, StragglerKind::kCleared);
    EXPECT_GT(g.back().first_step, f[0].last_step) << g.back().message;
    EXPECT_NE(g.back().message.find("after it was named at step " + std::to_string(f[0].last_step)),
              std::string::npos)
        << g.back().message;
  }
}

// Named, cleared, and slow again at once: the second naming's figures come
// from the steps after the clear (the change-point test once kept older
// steps' values beside fresh sums, and read a 30 % slowdown as half that).
TEST(StragglerDetectorTest, ANodeSlowAgainRightAfterItsClearIsNamedWithItsOwnFigures) {
  StragglerPolicy p;
  StragglerDetector d(p);
  Job job;
  job.slow = [](int n, std::int64_t step) { return n == 2 && ((step >= 50 && step < 80) || step >= 110) ? 1.3 : 1.0; };
  auto f = job.Run(&d, 0, 120);
  std::vector<StragglerFinding> named;
  for (const StragglerFinding& x : f) {
    if (x.kind == StragglerKind::kStraggler && !x.evict) named.push_back(x);
  }
  ASSERT_EQ(named.size(), 2u);
  ASSERT_TRUE(std::any_of(f.begin(), f.end(), [](const StragglerFinding& x) { return x.kind == StragglerKind::kCleared; }));
  EXPECT_GE(named[1].first_step, 110) << named[1].message;
  EXPECT_LE(named[1].last_step, 114) << named[1].message;
  EXPECT_NEAR(named[1].slowdown, 0.3, 0.06) << named[1].message;
}

// A restarted controller restores a naming with its step: windows that
// ended before it do not clear it either.
TEST(StragglerDetectorTest, ARestoredNamingIsNotClearedByWindowsBeforeIt) {
  StragglerPolicy p;
  StragglerDetector d(p);
  d.Reset(8);
  d.RestoreReported("node1", StragglerSignal::kCompute, 40, 75, false);
  Job job;
  // Normal from the start: windows 1-6 (steps 10-69) end before step 75,
  // and clear nothing; 7-9 (steps 70-99) end after it and clear it.
  auto f = job.Run(&d, 0, 95);
  EXPECT_TRUE(f.empty()) << f.front().message;
  f = job.Run(&d, 95, 110);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, StragglerKind::kCleared);
  EXPECT_EQ(f[0].first_step, 70);
  EXPECT_EQ(f[0].last_step, 99);
}

// The change-point test names the phase that grew, as the windows do.
TEST(StragglerDetectorTest, AChangePointNamingSaysWhichPhaseGrew) {
  StragglerPolicy p;
  StragglerDetector d(p);
  Job job;
  job.slow = [](int n, std::int64_t step) { return n == 2 && step >= 80 ? 1.15 : 1.0; };
  auto f = job.Run(&d, 0, 100);
  ASSERT_FALSE(f.empty());
  EXPECT_NE(f[0].message.find("(change point)"), std::string::npos) << f[0].message;
  EXPECT_EQ(f[0].phase, "backward") << f[0].message;  // 15 % of the longer phase is the larger gap
  EXPECT_NE(f[0].message.find("most in backward"), std::string::npos) << f[0].message;
}

// Each generation learns its own baseline and says so once, with its steps:
// a restart is never judged against the steps before it.
TEST(StragglerDetectorTest, EachGenerationLearnsItsBaselineAndSaysSoOnce) {
  StragglerPolicy p;
  StragglerDetector d(p);
  Job job;
  job.keep_baseline = true;
  auto f = job.Run(&d, 0, 100);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, StragglerKind::kBaseline);
  EXPECT_EQ(f[0].first_step, p.window_steps);  // after the start-up window
  EXPECT_EQ(f[0].last_step, p.window_steps + p.change_baseline_steps - 1);
  EXPECT_NE(f[0].message.find("steps 10-39"), std::string::npos) << f[0].message;
  EXPECT_EQ(StragglerEventKind(f[0].kind), EventKind::kStragglerBaseline);
  d.Reset(8);
  // A restart from step 60: the node that is slower now is not compared
  // with the old generation's steps; the new baseline starts at 70.
  f = job.Run(&d, 60, 110);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].kind, StragglerKind::kBaseline);
  EXPECT_EQ(f[0].first_step, 70);
  EXPECT_EQ(f[0].last_step, 99);
}

TEST(StragglerDetectorTest, RanksThatBringAHeartbeatsStepsOutOfPhaseAreAllJudged) {
  // 85 ms steps, a heartbeat a second: each node brings 12 steps at a time,
  // node3's agent the last to send (its first heartbeat brings 25 steps).
  // node3 computes 1.2x from the start; it is named at the same step as when
  // every step comes at once: no step of it was judged without it.
  for (unsigned seed = 1; seed <= 5; ++seed) {
    std::int64_t named[2] = {-1, -1};
    for (int batch : {0, 12}) {
      Job job = CrowdedCpuJob();
      job.work = [](int n, std::int64_t) { return n == 3 ? 1.2 : 1.0; };
      job.slow = job.work;
      job.batch = batch;
      job.keep_baseline = true;
      job.rng.seed(seed);
      StragglerDetector d(StragglerPolicy{});
      d.Reset(2 * job.nodes);  // the generation's world, as the controller says it
      auto f = job.Run(&d, 0, 80);
      for (const auto& x : f) {
        if (x.kind == StragglerKind::kBaseline) EXPECT_EQ(x.first_step, 10) << x.message;  // steps 10-39, all of them
      }
      auto first = std::find_if(f.begin(), f.end(), [](const StragglerFinding& x) { return x.kind == StragglerKind::kStraggler; });
      ASSERT_NE(first, f.end()) << "seed " << seed << " batch " << batch;
      EXPECT_EQ(first->node, "node3") << first->message;
      named[batch > 0] = first->last_step;
    }
    EXPECT_EQ(named[1], named[0]) << "seed " << seed;
  }
}

TEST(StragglerDetectorTest, AWindowWaitsForItsSlowestReporterButNotForever) {
  StragglerDetector d(StragglerPolicy{});
  for (std::int64_t step = 0; step < 10; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      RankStep s{"node" + std::to_string(rank), rank, step, 100, 100, 0, {}};
      if (rank == 2 && step > 4) continue;  // rank 2's reports are late
      d.Add(s);
    }
  }
  d.Evaluate();  // ranks brought 10 steps at a time: a silent rank is waited for 20 steps
  for (std::int64_t step = 10; step < 29; ++step) d.Add(RankStep{"node0", 0, step, 100, 100, 0, {}});
  d.Evaluate();
  // Window 0 was judged only once rank 0 was 20 steps further; the late
  // reports of rank 2 for it are then dropped.
  d.Add(RankStep{"node0", 0, 29, 100, 100, 0, {}});
  EXPECT_TRUE(d.Evaluate().empty());
  d.Add(RankStep{"node2", 2, 6, 1e9, 1e9, 0, {}});
  EXPECT_TRUE(d.Evaluate().empty());
}

// Agents report at their own times: a window waits for every rank of the
// world, not just those heard from so far.
TEST(StragglerDetectorTest, AWindowWaitsForRanksNotHeardFromYet) {
  StragglerPolicy p;
  StragglerDetector d(p);
  d.Reset(4);
  Job job;
  job.nodes = 4;
  job.slow = [](int n, std::int64_t) { return n == 3 ? 1.3 : 1.0; };
  // Nodes 0..2 send 60 steps first (as whole messages would), then node 3.
  std::vector<RankStep> late;
  for (std::int64_t step = 0; step < 60; ++step) {
    for (int n = 0; n < 4; ++n) {
      RankStep s;
      s.node = "node" + std::to_string(n);
      s.rank = n;
      s.step = step;
      s.phases = {{"forward", 30000.0 * job.slow(n, step)}};
      s.step_us = 100000;
      FillSignals(&s);
      if (n == 3) {
        late.push_back(s);
      } else {
        d.Add(s);
      }
    }
    if (step < 9) {
      EXPECT_TRUE(d.Evaluate().empty());
    }
  }
  for (const auto& s : late) d.Add(s);
  auto f = Named(d.Evaluate());
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].node, "node3");
}

TEST(StragglerDetectorTest, ReportsASlowTrendOnceNamingThePhaseThatGrew) {
  StragglerPolicy p;
  StragglerDetector d(p);
  std::vector<StragglerFinding> all;
  for (std::int64_t step = 0; step < 400; ++step) {
    for (int rank = 0; rank < 4; ++rank) {
      RankStep s;
      s.node = "node" + std::to_string(rank);
      s.rank = rank;
      s.step = step;
      double data = step < 100 ? 5000 : 5000 + 60.0 * (step - 100);  // the data loader slows down
      s.phases = {{"data", data}, {"forward", 30000}, {"backward", 60000}};
      s.step_us = data + 90000;
      FillSignals(&s);
      d.Add(s);
    }
    for (auto& f : Named(d.Evaluate())) all.push_back(f);
  }
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, StragglerKind::kSlowTrend);
  EXPECT_EQ(all[0].phase, "data");
  EXPECT_GE(all[0].slowdown, p.trend_threshold);
  EXPECT_NE(all[0].message.find("step time grew"), std::string::npos);
  EXPECT_NE(all[0].message.find("in phase data"), std::string::npos);
}

TEST(StragglerDetectorTest, SignalsComeFromDeviceTimeWhenThereIsSome) {
  RankStep s;
  s.step_us = 1000;
  s.phases = {{"forward", 100}, {"gpu:forward", 300}, {"gpu:backward", 500}, {"comm:all_reduce", 50},
              {"cpu:forward", 90}};
  FillSignals(&s);
  EXPECT_EQ(s.compute_us, 800);
  EXPECT_EQ(s.cpu_us, 0);  // on a device, forward's CPU time is launching kernels
  RankStep cpu;
  cpu.phases = {{"forward", 100}, {"backward", 300}, {"optimizer", 20}, {"data", 7},
                {"cpu:forward", 95}, {"cpu:backward", 250}, {"cpu:optimizer", 19}};
  FillSignals(&cpu);
  EXPECT_EQ(cpu.compute_us, 120);  // backward holds DDP's wait for the others
  EXPECT_EQ(cpu.cpu_us, 114);      // and its CPU time, the all-reduce threads' waiting
  EXPECT_EQ(s.comm_us, 50);
  RankStep bare;
  bare.step_us = 1000;
  bare.phases = {{"comm:all_reduce", 200}};
  FillSignals(&bare);
  EXPECT_EQ(bare.compute_us, 800);
}

double BruteMedian(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

TEST(StragglerDetectorTest, MediansOfOthersMatchesOneMedianPerValue) {
  std::mt19937 rng(3);
  for (int n = 2; n <= 40; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> v(static_cast<std::size_t>(n));
      // Small integers: many ties, the case where "leave out which copy" matters.
      for (double& x : v) x = std::uniform_int_distribution<int>(0, trial % 2 == 0 ? 5 : 1000)(rng);
      std::vector<double> got = MediansOfOthers(v);
      ASSERT_EQ(got.size(), v.size());
      for (std::size_t k = 0; k < v.size(); ++k) {
        std::vector<double> others;
        for (std::size_t j = 0; j < v.size(); ++j) {
          if (j != k) others.push_back(v[j]);
        }
        ASSERT_DOUBLE_EQ(got[k], BruteMedian(others)) << "n=" << n << " k=" << k;
      }
    }
  }
  EXPECT_TRUE(MediansOfOthers({}).empty());
  EXPECT_EQ(MediansOfOthers({4.0}), std::vector<double>{0.0});
}

TEST(StragglerDetectorTest, AThousandNodeJobNamesItsOneSlowNode) {
  StragglerPolicy p;
  StragglerDetector d(p);
  Job job;
  job.nodes = 1000;
  job.slow = [](int n, std::int64_t step) { return n == 617 && step >= 40 ? 1.10 : 1.0; };
  auto f = job.Run(&d, 0, 46);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].node, "node617") << f[0].message;
  EXPECT_EQ(d.Stragglers(), std::set<std::string>{"node617"});
}

TEST(StragglerDetectorTest, ARankWaitingForItsDataIsADataStragglerAndItsWaitingPeersAreNot) {
  for (int nodes : {3, 4, 6}) {
    StragglerPolicy p;
    StragglerDetector d(p);
    Job job;
    job.nodes = nodes;
    // Rank 3 (node 1) waits 25 ms for each batch: a quarter of the step.
    job.data = [](int n, int r, std::int64_t) { return n == 1 && r == 1 ? 25000.0 : 0.0; };
    auto f = job.Run(&d, 0, 60);
    ASSERT_FALSE(f.empty()) << nodes << " nodes";
    EXPECT_EQ(f[0].kind, StragglerKind::kStraggler);
    EXPECT_EQ(f[0].node, "node1");
    EXPECT_EQ(f[0].signal, StragglerSignal::kData);
    EXPECT_EQ(f[0].rank, 3);
    EXPECT_NEAR(f[0].slowdown, 0.2, 0.03) << f[0].message;  // 25 ms of a 125 ms step
    EXPECT_NE(f[0].message.find("is a data straggler: rank 3 waits for data"), std::string::npos) << f[0].message;
    for (const auto& x : f) EXPECT_EQ(x.node, "node1") << nodes << " nodes: " << x.message;  // no peer is blamed
  }
  // Every rank waits alike (a slow shared store): nobody stands out.
  StragglerDetector d(StragglerPolicy{});
  Job job;
  job.data = [](int, int, std::int64_t) { return 25000.0; };
  EXPECT_TRUE(job.Run(&d, 0, 60).empty());
}

TEST(StragglerDetectorTest, ASlowerComputeThatCostsTheStepNothingIsNotAStraggler) {
  // 2 s steps of which compute is 35 ms: node 2's 20 % slower compute is
  // 7 ms, 0.35 % of the step.
  StragglerDetector d(StragglerPolicy{});
  Job job;
  job.idle_us = 2e6;
  job.slow = [](int n, std::int64_t step) { return n == 2 && step >= 40 ? 1.2 : 1.0; };
  for (const auto& f : job.Run(&d, 0, 100)) ADD_FAILURE() << f.message;
  // The same slowness in 125 ms steps is one.
  StragglerDetector e(StragglerPolicy{});
  Job busy;
  busy.slow = job.slow;
  auto f = busy.Run(&e, 0, 100);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].node, "node2");
}

// Feeds `d` one step of four 1-rank nodes whose compute is 50 ms times
// `ratio(node)`, and returns what it names.
std::vector<StragglerFinding> ExactStep(StragglerDetector* d, std::int64_t step, const std::function<double(int)>& ratio) {
  for (int n = 0; n < 4; ++n) {
    RankStep s;
    s.node = "node" + std::to_string(n);
    s.rank = n;
    s.step = step;
    s.phases["forward"] = 50000 * ratio(n);
    s.phases["comm:all_reduce"] = 10000;
    s.step_us = 65000;
    FillSignals(&s);
    d->Add(s);
  }
  return Named(d->Evaluate());
}

TEST(StragglerDetectorTest, AUnitIsJudgedFromItsMeanAsTheStepsRefineItNotFromItsFirstThirtySteps) {
  // node3 learns its baseline at the others' pace, then settles 3.3 %
  // slower (its own, below half the threshold), then spends five steps
  // 7.2 % slower: two of its deviations above where it now runs, not the
  // four its 30-step baseline would make of them.
  auto run = [](StragglerPolicy p) {
    StragglerDetector d(p);
    std::vector<StragglerFinding> named;
    for (std::int64_t step = 0; step < 420; ++step) {
      const double r3 = step < 40 ? 1.0 : step >= 400 && step < 405 ? 1.072 : 1.033;
      for (auto& f : ExactStep(&d, step, [&](int n) { return n == 3 ? r3 : 1.0; })) named.push_back(f);
    }
    return named;
  };
  for (const auto& f : run(StragglerPolicy{})) ADD_FAILURE() << f.message;
  StragglerPolicy fixed;
  fixed.refine_mean = false;
  auto named = run(fixed);
  ASSERT_EQ(named.size(), 1u);  // the baseline's mean alone reads the burst as a shift of four deviations
  EXPECT_EQ(named[0].node, "node3");
  EXPECT_GE(named[0].last_step, 400);
}

TEST(StragglerDetectorTest, AWindowIsSlowOnlyBeyondWhatItsNoiseMovesAWindowsMedian) {
  // The windows alone, on a job whose phases move +-50 % a step: a window's
  // median ratio moves by about 8 %, so 7 % is noise; the gate (3 standard
  // errors of a window's median) keeps it quiet and still finds 1.6x.
  StragglerPolicy windows;
  windows.change_threshold = 1e9;
  StragglerPolicy ungated = windows;
  ungated.window_noise_gate = false;
  Job job;
  job.noise = 0.5;
  std::size_t gated_named = 0, ungated_named = 0;
  for (unsigned seed = 1; seed <= 10; ++seed) {
    StragglerDetector d(windows), u(ungated);
    job.rng.seed(seed);
    gated_named += job.Run(&d, 0, 300).size();
    job.rng.seed(seed);
    ungated_named += job.Run(&u, 0, 300).size();
  }
  EXPECT_EQ(gated_named, 0u);
  EXPECT_GT(ungated_named, 0u);  // what the gate prevents
  Job slow = job;
  slow.slow = [](int n, std::int64_t) { return n == 2 ? 1.6 : 1.0; };
  for (unsigned seed = 1; seed <= 5; ++seed) {
    StragglerDetector d(windows);
    slow.rng.seed(seed);
    auto f = slow.Run(&d, 0, 100);
    ASSERT_FALSE(f.empty()) << "seed " << seed;
    EXPECT_EQ(f[0].node, "node2") << f[0].message;
  }
}

}  // namespace
}  // namespace trainguard
