#include "agent/gpu_telemetry.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace trainguard {
namespace {

// NVML's C interface, as its header declares it (nvml.h): every call
// returns 0 (NVML_SUCCESS) or an error code; a device is an opaque handle.
using NvmlReturn = int;
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kClockSm = 1, kClockMem = 2;          // nvmlClockType_t
constexpr int kTemperatureGpu = 0;                  // nvmlTemperatureSensors_t
constexpr int kEccCorrected = 0, kEccUncorrected = 1, kEccVolatile = 0;
constexpr unsigned int kNvLinkMaxLinks = 18;        // NVML_NVLINK_MAX_LINKS
constexpr int kNvLinkCounters = 4;                  // DL replay, recovery, CRC flit, CRC data
constexpr unsigned long long kEventXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError
// nvmlEventData_t as nvmlEventSetWait_v2 fills it.
struct NvmlEventData {
  NvmlDevice device;
  unsigned long long event_type;
  unsigned long long event_data;  // the Xid, for an Xid critical error
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
constexpr std::size_t kXidsPerSample = 256;  // drained at most per sample: a storm waits for the next

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool Number(const std::string& cell, double* out) {
  std::string c = Trim(cell);
  if (c.empty() || c[0] == '[') return false;  // [N/A], [Not Supported]
  char* end = nullptr;
  double v = c.rfind("0x", 0) == 0 ? static_cast<double>(std::strtoull(c.c_str(), &end, 16)) : std::strtod(c.c_str(), &end);
  if (end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

struct Nvml::Api {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  NvmlReturn (*count)(unsigned int*);
  NvmlReturn (*handle)(unsigned int, NvmlDevice*);
  // Optional: a GPU or driver without them reports those fields unknown.
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*clock)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*throttle)(NvmlDevice, unsigned long long*) = nullptr;
  NvmlReturn (*ecc)(NvmlDevice, int, int, unsigned long long*) = nullptr;
  NvmlReturn (*remapped)(NvmlDevice, unsigned int*, unsigned int*, unsigned int*, unsigned int*) = nullptr;
  NvmlReturn (*pcie_replay)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*nvlink_errors)(NvmlDevice, unsigned int, int, unsigned long long*) = nullptr;
  NvmlReturn (*event_set_create)(void**) = nullptr;
  NvmlReturn (*register_events)(NvmlDevice, unsigned long long, void*) = nullptr;
  NvmlReturn (*event_set_wait)(void*, NvmlEventData*, unsigned int) = nullptr;
  NvmlReturn (*event_set_free)(void*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Open(const std::string& path, std::string* why) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    *why = "NVML not loaded (" + path + "): " + std::string(dlerror());
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  auto sym = [&](auto* fn, std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (void* p = dlsym(h, name)) {
        *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
        return true;
      }
    }
    return false;
  };
  bool required = sym(&api->init, {"nvmlInit_v2", "nvmlInit"}) && sym(&api->shutdown, {"nvmlShutdown"}) &&
                  sym(&api->count, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}) &&
                  sym(&api->handle, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  if (!required) {
    *why = "NVML at " + path + " lacks nvmlInit, nvmlDeviceGetCount or nvmlDeviceGetHandleByIndex";
    dlclose(h);
    return nullptr;
  }
  sym(&api->utilization, {"nvmlDeviceGetUtilizationRates"});
  sym(&api->clock, {"nvmlDeviceGetClockInfo"});
  sym(&api->temperature, {"nvmlDeviceGetTemperature"});
  sym(&api->power, {"nvmlDeviceGetPowerUsage"});
  sym(&api->throttle, {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
  sym(&api->ecc, {"nvmlDeviceGetTotalEccErrors"});
  sym(&api->remapped, {"nvmlDeviceGetRemappedRows"});
  sym(&api->pcie_replay, {"nvmlDeviceGetPcieReplayCounter"});
  sym(&api->nvlink_errors, {"nvmlDeviceGetNvLinkErrorCounter"});
  sym(&api->event_set_create, {"nvmlEventSetCreate"});
  sym(&api->register_events, {"nvmlDeviceRegisterEvents"});
  sym(&api->event_set_wait, {"nvmlEventSetWait_v2"});
  sym(&api->event_set_free, {"nvmlEventSetFree"});
  if (NvmlReturn r = api->init(); r != kNvmlSuccess) {
    *why = "nvmlInit failed with NVML error " + std::to_string(r);
    dlclose(h);
    return nullptr;
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->handle_ = h;
  nvml->api_ = std::move(api);
  nvml->WatchXids();
  return nvml;
}

void Nvml::WatchXids() {
  if (!api_->event_set_create || !api_->register_events || !api_->event_set_wait) return;
  unsigned int count = 0;
  if (api_->count(&count) != kNvmlSuccess || api_->event_set_create(&events_) != kNvmlSuccess) {
    events_ = nullptr;
    return;
  }
  for (unsigned int i = 0; i < count && i < 64; ++i) {
    NvmlDevice d = nullptr;
    if (api_->handle(i, &d) != kNvmlSuccess) d = nullptr;
    // A GPU that cannot report them (NVML_ERROR_NOT_SUPPORTED) keeps its count unknown.
    const bool watched = d != nullptr && api_->register_events(d, kEventXidCriticalError, events_) == kNvmlSuccess;
    devices_.push_back(d);
    xid_counts_.push_back(watched ? 0 : -1);
    last_xid_.push_back(-1);
  }
}

void Nvml::DrainXids() {
  if (events_ == nullptr) return;
  for (std::size_t n = 0; n < kXidsPerSample; ++n) {
    NvmlEventData data{};
    if (api_->event_set_wait(events_, &data, 0) != kNvmlSuccess) return;  // NVML_ERROR_TIMEOUT: none left
    if ((data.event_type & kEventXidCriticalError) == 0) continue;
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] != data.device || xid_counts_[i] < 0) continue;
      ++xid_counts_[i];
      last_xid_[i] = static_cast<std::int64_t>(data.event_data);
    }
  }
}

Nvml::~Nvml() {
  if (events_ != nullptr && api_->event_set_free) api_->event_set_free(events_);
  if (api_) api_->shutdown();
  if (handle_ != nullptr) dlclose(handle_);
}

std::vector<GpuSample> Nvml::Sample() {
  std::vector<GpuSample> out;
  DrainXids();
  unsigned int count = 0;
  if (api_->count(&count) != kNvmlSuccess) return out;
  for (unsigned int i = 0; i < count && i < 64; ++i) {
    NvmlDevice d = nullptr;
    if (api_->handle(i, &d) != kNvmlSuccess) continue;
    GpuSample s;
    s.index = static_cast<int>(i);
    NvmlUtilization u{};
    if (api_->utilization && api_->utilization(d, &u) == kNvmlSuccess) {
      s.utilization_pct = u.gpu;
      s.memory_utilization_pct = u.memory;
    }
    unsigned int v = 0;
    if (api_->clock && api_->clock(d, kClockSm, &v) == kNvmlSuccess) s.sm_clock_mhz = v;
    if (api_->clock && api_->clock(d, kClockMem, &v) == kNvmlSuccess) s.memory_clock_mhz = v;
    if (api_->temperature && api_->temperature(d, kTemperatureGpu, &v) == kNvmlSuccess) s.temperature_c = v;
    if (api_->power && api_->power(d, &v) == kNvmlSuccess) s.power_w = v / 1000.0;  // milliwatts
    unsigned long long ull = 0;
    if (api_->throttle && api_->throttle(d, &ull) == kNvmlSuccess) s.throttle_reasons = static_cast<std::int64_t>(ull);
    if (api_->ecc && api_->ecc(d, kEccCorrected, kEccVolatile, &ull) == kNvmlSuccess) {
      s.ecc_corrected = static_cast<std::int64_t>(ull);
    }
    if (api_->ecc && api_->ecc(d, kEccUncorrected, kEccVolatile, &ull) == kNvmlSuccess) {
      s.ecc_uncorrected = static_cast<std::int64_t>(ull);
    }
    unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    if (api_->remapped && api_->remapped(d, &corrected, &uncorrected, &pending, &failed) == kNvmlSuccess) {
      s.remapped_rows_pending = pending;
      s.remapped_rows_failed = failed;
    }
    if (api_->pcie_replay && api_->pcie_replay(d, &v) == kNvmlSuccess) s.pcie_replays = v;
    if (api_->nvlink_errors) {
      std::int64_t total = 0;
      bool any = false;
      for (unsigned int link = 0; link < kNvLinkMaxLinks; ++link) {
        for (int counter = 0; counter < kNvLinkCounters; ++counter) {
          if (api_->nvlink_errors(d, link, counter, &ull) == kNvmlSuccess) {
            total += static_cast<std::int64_t>(ull);
            any = true;
          }
        }
      }
      if (any) s.nvlink_errors = total;
    }
    if (i < xid_counts_.size()) {
      s.xid_events = xid_counts_[i];
      s.last_xid = last_xid_[i];
    }
    out.push_back(s);
  }
  return out;
}

void FillGpuHealth(const GpuSample& g, v1::GpuHealth* out) {
  out->set_index(g.index);
  out->set_utilization_pct(g.utilization_pct);
  out->set_memory_utilization_pct(g.memory_utilization_pct);
  out->set_sm_clock_mhz(g.sm_clock_mhz);
  out->set_memory_clock_mhz(g.memory_clock_mhz);
  out->set_temperature_c(g.temperature_c);
  out->set_power_w(g.power_w);
  out->set_throttle_reasons(g.throttle_reasons);
  out->set_ecc_corrected(g.ecc_corrected);
  out->set_ecc_uncorrected(g.ecc_uncorrected);
  out->set_remapped_rows_pending(g.remapped_rows_pending);
  out->set_remapped_rows_failed(g.remapped_rows_failed);
  out->set_pcie_replays(g.pcie_replays);
  out->set_nvlink_errors(g.nvlink_errors);
  out->set_xid_events(g.xid_events);
  out->set_last_xid(g.last_xid);
}

const char* const kNvidiaSmiGpuQuery =
    "index,utilization.gpu,utilization.memory,clocks.sm,clocks.mem,temperature.gpu,power.draw,"
    "clocks_throttle_reasons.active,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total";

std::vector<GpuSample> ParseNvidiaSmiGpus(const std::string& csv) {
  std::vector<GpuSample> out;
  std::istringstream lines(csv);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    double v = 0;
    if (cells.size() < 10 || !Number(cells[0], &v)) continue;
    GpuSample s;
    s.index = static_cast<int>(v);
    double* doubles[] = {&s.utilization_pct, &s.memory_utilization_pct, &s.sm_clock_mhz, &s.memory_clock_mhz,
                         &s.temperature_c, &s.power_w};
    for (int i = 0; i < 6; ++i) {
      if (Number(cells[1 + i], &v)) *doubles[i] = v;
    }
    if (Number(cells[7], &v)) s.throttle_reasons = static_cast<std::int64_t>(v);
    if (Number(cells[8], &v)) s.ecc_corrected = static_cast<std::int64_t>(v);
    if (Number(cells[9], &v)) s.ecc_uncorrected = static_cast<std::int64_t>(v);
    out.push_back(s);
  }
  return out;
}

GpuTelemetry::GpuTelemetry(Options options) : options_(std::move(options)) {
  // Everything, NVML's initialisation included (seconds on a GPU without
  // persistence mode), happens on the sampling thread.
  thread_ = std::thread([this] { Run(); });
}

GpuTelemetry::~GpuTelemetry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<GpuSample> GpuTelemetry::Latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

std::vector<GpuSample> GpuTelemetry::Fresh(Nanos timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t want = ++asked_;
  wake_.notify_all();
  sampled_cv_.wait_for(lock, std::chrono::nanoseconds(timeout),
                       [&] { return sampled_ >= want || !sampling_ || stop_; });
  return latest_;
}

std::string GpuTelemetry::source() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

void GpuTelemetry::Run() {
  struct Ended {  // however Run returns, a Fresh caller stops waiting
    GpuTelemetry* t;
    ~Ended() {
      std::lock_guard<std::mutex> lock(t->mu_);
      t->sampling_ = false;
      t->sampled_cv_.notify_all();
    }
  } ended{this};
  std::string why;
  nvml_ = Nvml::Open(options_.nvml_path, &why);
  if (nvml_) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = "nvml";
  } else {
    // nvidia-smi alone, where it runs at all (a node without NVIDIA GPUs
    // has none): asked here, off the caller's thread.
    if (options_.nvidia_smi.empty() ||
        std::system(("timeout 10 " + options_.nvidia_smi + " -L >/dev/null 2>&1").c_str()) != 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    source_ = "nvidia-smi";
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const std::uint64_t answers = asked_;
    lock.unlock();
    std::vector<GpuSample> sample;
    if (nvml_) {
      sample = nvml_->Sample();
    } else {
      std::string cmd = "timeout 10 " + options_.nvidia_smi + " --query-gpu=" + kNvidiaSmiGpuQuery +
                        " --format=csv,noheader,nounits 2>/dev/null";
      std::string text;
      if (FILE* p = popen(cmd.c_str(), "r")) {
        char buf[4096];
        std::size_t n;
        while ((n = fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
        pclose(p);
      }
      sample = ParseNvidiaSmiGpus(text);
    }
    lock.lock();
    latest_ = std::move(sample);
    sampled_ = answers;
    sampled_cv_.notify_all();
    wake_.wait_for(lock, std::chrono::nanoseconds(options_.interval), [this] { return stop_ || asked_ > sampled_; });
  }
}

}  // namespace trainguard
