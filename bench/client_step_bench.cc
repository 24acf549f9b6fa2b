// Cost of one client step() call, and of one timed phase change (SetPhase:
// the previous phase's interval into the timing ring, the new name under
// the sequence lock), attached to a real status page, against a bare
// relaxed atomic store (the floor) measured in the same run.
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "common/status_page.h"
#include "trainguard/client.h"

namespace {

std::string g_path;

void BM_BaselineAtomicStore(benchmark::State& state) {
  static std::atomic<long> value{0};
  long i = 0;
  for (auto _ : state) value.store(++i, std::memory_order_release);
}
BENCHMARK(BM_BaselineAtomicStore);

void BM_StepAttached(benchmark::State& state) {
  long i = 0;
  for (auto _ : state) trainguard::client::Step(++i);
}
BENCHMARK(BM_StepAttached);

// A training step's worth of phase changes: forward, backward, optimizer, none.
void BM_PhaseChange(benchmark::State& state) {
  const char* phases[] = {"forward", "backward", "optimizer", ""};
  long i = 0;
  for (auto _ : state) trainguard::client::SetPhase(phases[++i & 3]);
}
BENCHMARK(BM_PhaseChange);

void BM_StepDetached(benchmark::State& state) {
  trainguard::client::Shutdown();
  long i = 0;
  for (auto _ : state) trainguard::client::Step(++i);
  trainguard::client::Init();
}
BENCHMARK(BM_StepDetached);

}  // namespace

int main(int argc, char** argv) {
  g_path = "/dev/shm/trainguard-bench-" + std::to_string(getpid());
  auto page = trainguard::MappedStatusPage::Create(g_path);
  if (!page.ok()) return 1;
  setenv(trainguard::client::kStatusPageEnv, g_path.c_str(), 1);
  if (!trainguard::client::Init()) return 1;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  unlink(g_path.c_str());
  return 0;
}
