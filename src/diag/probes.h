// The node self-checks of the quick diagnostics suite: compute (a GEMM),
// memory bandwidth, and disk write+fsync/read throughput and free space on
// the paths a job writes. Each probe runs for a bounded time and returns a
// figure, or an error that says what failed (a full disk is a finding, not a
// crash). GPU, network and collective checks come later behind the same
// Figure shape.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace trainguard {

struct Figure {
  Figure(std::string name_ = "", double value_ = 0, std::string error_ = "", std::string device_ = "")
      : name(std::move(name_)), value(value_), error(std::move(error_)), device(std::move(device_)) {}
  std::string name;    // "compute_gflops", "memory_gbps", "disk_write_mbps:/ckpt", ...
  double value = 0;    // in the unit the name ends with
  std::string error;   // non-empty: the probe could not measure (the check fails)
  // Per-GPU figures: the device's model as the driver names it ("NVIDIA
  // H100 80GB HBM3"); floors are per model, and only GPUs of one model are
  // compared with each other.
  std::string device;
};

// How long each probe may run. Compute and memory are measured in windows
// of `window` and report the best window: a neighbour's burst of work
// lowers one window, not the figure, while a CPU quota (whose period is far
// shorter than a window) lowers every window alike.
struct ProbeBudget {
  Nanos compute = 1000 * kMillisecond;
  Nanos memory = 1000 * kMillisecond;
  Nanos window = 200 * kMillisecond;
  std::int64_t disk_bytes = 32ll << 20;
  std::int64_t net_bytes = 8ll << 20;  // each way, per neighbour

  static ProbeBudget Quick() { return {}; }
  static ProbeBudget Full() {
    return {5000 * kMillisecond, 3000 * kMillisecond, 250 * kMillisecond, 256ll << 20, 64ll << 20};
  }
};

// Single-threaded float GEMM, 256x256: GFLOP/s of the best window.
Figure MeasureCompute(Nanos budget, Nanos window);
// A known-answer check for silent data corruption (docs/sdc.md): float GEMMs
// of fixed-seed small integers (every sum exact in any order) compared with
// the exact integer product: the number of elements computed wrong (must be 0).
Figure CheckKnownAnswer();
// memcpy between two 64 MiB buffers: GB/s (bytes read + written) of the best window.
Figure MeasureMemory(Nanos budget, Nanos window);
// Writes `bytes` to a new file under `dir` (O_EXCL), fsyncs, reads it back
// past the page cache, removes it; plus the free space of the file system.
// Three figures, named by the path's role (so that nodes whose checkpoint
// directories differ are still compared): disk_write_mbps:<role>,
// disk_read_mbps:<role>, disk_free_gib:<role>.
std::vector<Figure> MeasureDisk(const std::string& role, const std::string& dir, std::int64_t bytes);

}  // namespace trainguard
