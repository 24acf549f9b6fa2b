// CUDA HostMemory: page-locked buffers (cudaHostAlloc) and device-to-host
// copies on a dedicated stream. Compiled only when the CUDA toolkit is found
// (TRAINGUARD_WITH_CUDA); chosen at run time only if a GPU is visible.
#include <cuda_runtime_api.h>

#include "checkpoint/host_memory.h"

namespace trainguard {

namespace {

class CudaHostMemory final : public HostMemory {
 public:
  CudaHostMemory() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~CudaHostMemory() override { cudaStreamDestroy(stream_); }
  void* Allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) return nullptr;
    return p;
  }
  void Free(void* p, std::size_t) override { cudaFreeHost(p); }
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
