// CUDA HostMemory: page-locked buffers (cudaHostAlloc) and device-to-host
// copies on a dedicated stream. Compiled only when the CUDA toolkit is found
// (TRAINGUARD_WITH_CUDA); chosen at run time only if a GPU is visible.
#include <cuda_runtime_api.h>

#include "checkpoint/host_memory.h"

namespace trainguard {

namespace {

class CudaHostMemory final : public HostMemory {
 public:
  CudaHostMemory() {
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming);
  }
  ~CudaHostMemory() override {
    cudaEventDestroy(produced_);
    cudaStreamDestroy(stream_);
  }
  void* Allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) return nullptr;
    return p;
  }
  void Free(void* p, std::size_t) override { cudaFreeHost(p); }
  // The side stream does not synchronise with any other stream by itself
  // (cudaStreamNonBlocking): without this wait the copies could overtake the
  // training stream's queued kernels and save stale values.
  Status WaitFor(void* device_stream) override {
    cudaStream_t producer = device_stream != nullptr ? static_cast<cudaStream_t>(device_stream)
                                                     : cudaStreamLegacy;
    cudaError_t err = cudaEventRecord(produced_, producer);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, produced_, 0);
    if (err != cudaSuccess) return IoError(std::string("waiting for the training stream: ") + cudaGetErrorString(err));
    return Status::Ok();
  }
  Status CopyFromDevice(void* dst, const void* src, std::size_t bytes) override {
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
    if (err != cudaSuccess) return IoError(std::string("cudaMemcpyAsync: ") + cudaGetErrorString(err));
    return Status::Ok();
  }
  Status Sync() override {
    cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) return IoError(std::string("cudaStreamSynchronize: ") + cudaGetErrorString(err));
    return Status::Ok();
  }
  const char* name() const override { return "cuda-pinned"; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t produced_ = nullptr;
};

}  // namespace

std::unique_ptr<HostMemory> MakeHostMemory() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    return std::make_unique<CudaHostMemory>();
  }
  return MakeCpuHostMemory();
}

}  // namespace trainguard
