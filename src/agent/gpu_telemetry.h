// GPU health for every heartbeat: each GPU's utilisation, clocks,
// temperature, power, throttle reasons, ECC and remapped rows, PCIe replays
// and NVLink errors. Read through NVML loaded at run time (dlopen of the
// driver's libnvidia-ml.so.1: nothing is needed at build time, and a node
// without a GPU reports none), else from `nvidia-smi --query-gpu` (fewer
// fields), on a thread of its own once per interval: a slow driver call
// never delays a heartbeat, which takes the newest sample.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/gpu_reasons.h"
#include "proto/protocol.h"

namespace trainguard {

struct GpuSample {
  int index = -1;
  // -1: not known (not supported by the GPU, or by the source).
  double utilization_pct = -1;
  double memory_utilization_pct = -1;
  double sm_clock_mhz = -1;
  double memory_clock_mhz = -1;
  double temperature_c = -1;
  double power_w = -1;
  std::int64_t throttle_reasons = -1;  // NVML's clocks-event bit mask
  std::int64_t ecc_corrected = -1;     // volatile (since the driver loaded)
  std::int64_t ecc_uncorrected = -1;
  std::int64_t remapped_rows_pending = -1;
  std::int64_t remapped_rows_failed = -1;
  std::int64_t pcie_replays = -1;
  std::int64_t nvlink_errors = -1;     // replay, recovery and CRC errors over every link
  std::int64_t xid_events = -1;        // Xid critical errors NVML reported since the agent began
  std::int64_t last_xid = -1;          // the newest one's Xid number
};

// NVML, loaded from `path` (default: the driver's libnvidia-ml.so.1).
class Nvml {
 public:
  // Null when the library or its entry points are missing or nvmlInit fails;
  // `why` says which.
  static std::unique_ptr<Nvml> Open(const std::string& path, std::string* why);
  ~Nvml();
  std::vector<GpuSample> Sample();

  struct Api;

 private:
  Nvml() = default;
  // Xid critical errors: NVML's event set, registered for every GPU once
  // (nvmlDeviceRegisterEvents), drained without waiting at each sample.
  void WatchXids();
  void DrainXids();
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  void* events_ = nullptr;                // nvmlEventSet_t, null: Xids not known
  std::vector<void*> devices_;            // index -> handle, as registered
  std::vector<std::int64_t> xid_counts_;  // index -> Xids so far
  std::vector<std::int64_t> last_xid_;    // index -> the newest Xid, -1 none
};

// A sample as heartbeats and stop reports carry it.
void FillGpuHealth(const GpuSample& g, v1::GpuHealth* out);

// The fields `nvidia-smi` is asked for, and its CSV answer parsed
// (--format=csv,noheader,nounits; "[N/A]" and "[Not Supported]" are unknown).
extern const char* const kNvidiaSmiGpuQuery;
std::vector<GpuSample> ParseNvidiaSmiGpus(const std::string& csv);

// Samples every `interval` on its own thread from NVML, else nvidia-smi.
class GpuTelemetry {
 public:
  struct Options {
    std::string nvml_path = "libnvidia-ml.so.1";
    std::string nvidia_smi = "nvidia-smi";
    Nanos interval = 1 * kSecond;
  };
  explicit GpuTelemetry(Options options);
  ~GpuTelemetry();
  std::vector<GpuSample> Latest() const;
  // A sample taken after this call (the node's stop report: an Xid the
  // failure raised a moment ago), waiting at most `timeout`; the newest one
  // there is when none comes in time or there is no GPU.
  std::vector<GpuSample> Fresh(Nanos timeout);
  std::string source() const;  // "nvml", "nvidia-smi" or "" (no GPU, or not known yet)

 private:
  void Run();
  Options options_;
  std::unique_ptr<Nvml> nvml_;
  std::string source_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool sampling_ = true;      // false once the thread found no GPU and ended
  std::uint64_t asked_ = 0;   // Fresh calls so far
  std::uint64_t sampled_ = 0;  // the asks the newest sample answers
  std::condition_variable sampled_cv_;
  std::vector<GpuSample> latest_;
  std::thread thread_;
};

}  // namespace trainguard
