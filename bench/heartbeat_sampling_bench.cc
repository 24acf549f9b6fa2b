// What an agent's heartbeat costs the node's CPU, per heartbeat and as a
// share of one core at one heartbeat a second, for a node of 8 ranks (each
// with a DataLoader worker) and 8 GPUs. Beside it, in the same run, the
// baseline: the sampling every heartbeat did before issue 25 (the process
// groups' CPU and I/O counters). The GPUs are the NVML stand-in
// (src/agent/fake_nvml.cc, whose calls return at once): the figure is
// trainguard's own part; on a GPU add the driver's (measured there, not here).
//
//   build/bench/heartbeat_sampling_bench [--heartbeats 300] [--nvml PATH]
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "agent/cpu_pressure.h"
#include "agent/gpu_telemetry.h"
#include "agent/process.h"
#include "agent/storage_io.h"

using namespace trainguard;

namespace {

double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// A rank: a process group of a sleeping process and its sleeping worker.
pid_t StartRank() {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    if (fork() == 0) {
      for (;;) pause();
    }
    for (;;) pause();
  }
  setpgid(pid, pid);
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  int heartbeats = 300;
  std::string nvml = TG_FAKE_NVML;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--heartbeats") {
      heartbeats = std::atoi(argv[i + 1]);
    } else if (a == "--nvml") {
      nvml = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  setenv("TG_FAKE_NVML_GPUS", "8", 1);
  std::vector<pid_t> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back(StartRank());
  usleep(200 * 1000);  // the workers exist

  std::string why;
  std::unique_ptr<Nvml> gpus = Nvml::Open(nvml, &why);
  if (!gpus) {
    std::fprintf(stderr, "NVML: %s\n", why.c_str());
    return 1;
  }
  CpuPressure cpu;
  std::vector<BlockedTracker> blocked(ranks.size());

  auto measure = [&](auto&& heartbeat) {
    double t0 = ThreadCpuUs();
    for (int i = 0; i < heartbeats; ++i) heartbeat(i);
    return (ThreadCpuUs() - t0) / heartbeats;
  };
  double baseline = measure([&](int) { (void)SampleGroupsActivity(ranks); });
  double computing = measure([&](int i) {
    auto activity = SampleGroupsActivity(ranks);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      blocked[r].Update(FindBlockedTasks(activity[ranks[r]].uninterruptible, false), i * kSecond);
    }
    (void)cpu.Sample(ranks, i * kSecond);
    (void)gpus->Sample();
  });
  double quiet = measure([&](int i) {  // every rank quiet: every thread scanned, every data file listed
    auto activity = SampleGroupsActivity(ranks);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      blocked[r].Update(FindBlockedTasks(activity[ranks[r]].pids, true), i * kSecond);
      (void)OpenDataFiles(activity[ranks[r]].pids);
    }
    (void)cpu.Sample(ranks, i * kSecond);
    (void)gpus->Sample();
  });
  for (pid_t p : ranks) kill(-p, SIGKILL);
  for (pid_t p : ranks) waitpid(p, nullptr, 0);
  std::printf("%-52s %14s %22s\n", "per heartbeat, 8 ranks (+8 workers), 8 GPUs", "CPU us", "% of a core at 1/s");
  std::printf("%-52s %14.1f %22.3f\n", "baseline: process groups' counters (before)", baseline, baseline / 1e4);
  std::printf("%-52s %14.1f %22.3f\n", "now, ranks computing: + blocked I/O, CPU, GPUs", computing, computing / 1e4);
  std::printf("%-52s %14.1f %22.3f\n", "now, every rank quiet: every thread and data file", quiet, quiet / 1e4);
  return 0;
}
