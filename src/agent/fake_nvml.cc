// A stand-in for the driver's libnvidia-ml.so.1 (tests only; this machine
// has no GPU): the entry points trainguard calls, with NVML's signatures,
// answering for TG_FAKE_NVML_GPUS GPUs (default 8) with figures made from
// the index, GPU 3 thermally throttled at a low clock. With
// TG_FAKE_NVML_ECC_DIR, GPU 3's volatile uncorrected ECC count is the
// number in DIR/NODE (NODE: the agent's --node-id), 0 while it is absent:
// a test raises one node's count mid-job. With TG_FAKE_NVML_XID_DIR, each
// line "GPU XID" of DIR/NODE is one Xid critical-error event of that GPU,
// delivered once through the event set (NVML's nvmlEventSetWait_v2).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

extern "C" {

struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
};

static unsigned int Gpus() {
  const char* n = std::getenv("TG_FAKE_NVML_GPUS");
  return n == nullptr ? 8 : static_cast<unsigned int>(std::atoi(n));
}
// The agent's --node-id, from its command line (else TG_FAKE_NVML_NODE).
static std::string NodeId() {
  std::ifstream in("/proc/self/cmdline");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string prev;
  for (std::size_t at = 0; at < all.size();) {
    std::string arg(all.c_str() + at);
    if (prev == "--node-id") return arg;
    prev = arg;
    at += arg.size() + 1;
  }
  const char* node = std::getenv("TG_FAKE_NVML_NODE");
  return node == nullptr ? "" : node;
}
static unsigned long long InjectedEcc() {
  const char* dir = std::getenv("TG_FAKE_NVML_ECC_DIR");
  if (dir == nullptr) return 0;
  std::ifstream in(std::string(dir) + "/" + NodeId());
  unsigned long long n = 0;
  return in >> n ? n : 0;
}
static unsigned int IndexOf(void* device) { return static_cast<unsigned int>(reinterpret_cast<unsigned long>(device) - 1); }

int nvmlInit_v2() { return std::getenv("TG_FAKE_NVML_FAIL") ? 9 : 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = Gpus();
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= Gpus()) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = reinterpret_cast<void*>(static_cast<unsigned long>(index) + 1);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* device, nvmlUtilization_st* u) {
  u->gpu = 90 + IndexOf(device);
  u->memory = 40;
  return 0;
}
int nvmlDeviceGetClockInfo(void* device, int type, unsigned int* mhz) {
  *mhz = type == 1 ? (IndexOf(device) == 3 ? 1410 : 1980) : 2619;
  return 0;
}
int nvmlDeviceGetTemperature(void* device, int, unsigned int* c) {
  *c = IndexOf(device) == 3 ? 91 : 60 + IndexOf(device);
  return 0;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned int* mw) {
  *mw = 650000 + 1000 * IndexOf(device);
  return 0;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(void* device, unsigned long long* reasons) {
  *reasons = IndexOf(device) == 3 ? 0x40 | 0x20 : 0;
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* device, int type, int, unsigned long long* count) {
  *count = type == 0 ? 5 * IndexOf(device) : IndexOf(device) == 3 ? InjectedEcc() : 0;
  return 0;
}
int nvmlDeviceGetRemappedRows(void*, unsigned int* corr, unsigned int* unc, unsigned int* pending, unsigned int* failed) {
  *corr = 1;
  *unc = 0;
  *pending = 0;
  *failed = 0;
  return 0;
}
int nvmlDeviceGetPcieReplayCounter(void* device, unsigned int* value) {
  *value = IndexOf(device);
  return 0;
}
struct nvmlEventData_st {
  void* device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static unsigned long long g_registered = 0;  // event types asked for
static std::map<std::string, std::size_t> g_delivered;  // Xid file -> its lines delivered
int nvmlEventSetCreate(void** set) {
  *set = reinterpret_cast<void*>(0x5e7);
  return 0;
}
int nvmlDeviceRegisterEvents(void*, unsigned long long types, void*) {
  g_registered |= types;
  return 0;
}
int nvmlEventSetFree(void*) { return 0; }
int nvmlEventSetWait_v2(void*, nvmlEventData_st* data, unsigned int) {
  const char* dir = std::getenv("TG_FAKE_NVML_XID_DIR");
  if (dir == nullptr || (g_registered & 0x8) == 0) return 10;  // NVML_ERROR_TIMEOUT
  const std::string path = std::string(dir) + "/" + NodeId();
  std::ifstream in(path);
  unsigned int gpu = 0;
  unsigned long long xid = 0;
  for (std::size_t line = 0; in >> gpu >> xid; ++line) {
    if (line < g_delivered[path]) continue;
    ++g_delivered[path];
    if (gpu >= Gpus()) return 10;
    data->device = reinterpret_cast<void*>(static_cast<unsigned long>(gpu) + 1);
    data->eventType = 0x8;  // nvmlEventTypeXidCriticalError
    data->eventData = xid;
    data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
    return 0;
  }
  return 10;
}
int nvmlDeviceGetNvLinkErrorCounter(void*, unsigned int link, int counter, unsigned long long* value) {
  if (link >= 4) return 3;  // NVML_ERROR_NOT_SUPPORTED: a GPU with 4 links
  *value = counter == 0 ? 2 : 0;
  return 0;
}

}  // extern "C"
