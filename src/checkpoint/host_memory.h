// HostMemory: where phase 1 puts the snapshot. The CPU implementation hands
// out 2 MiB-aligned, pre-faulted memory (transparent huge pages where the
// kernel allows); the CUDA implementation (built when the CUDA toolkit is
// found, used when a GPU is present) hands out page-locked memory from
// cudaHostAlloc and copies device tensors on a side stream.
// Thread safety: Allocate/Free from one thread; CopyFromDevice from any.
#pragma once

#include <cstddef>
#include <memory>

#include "trainguard/status.h"

namespace trainguard {

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual void* Allocate(std::size_t bytes) = 0;  // nullptr on failure
  virtual void Free(void* p, std::size_t bytes) = 0;
  // Device-to-host copies of a save: first WaitFor() the producer's stream
  // (the copies start only after the work queued on it so far), then the
  // copies are queued, then Sync() waits for all of them.
  virtual Status WaitFor(void* device_stream) = 0;
  virtual Status CopyFromDevice(void* dst, const void* src, std::size_t bytes) = 0;
  virtual Status Sync() = 0;
  virtual const char* name() const = 0;
};

// The CUDA implementation if this build has it and a GPU is visible, else CPU.
std::unique_ptr<HostMemory> MakeHostMemory();
std::unique_ptr<HostMemory> MakeCpuHostMemory();

// A growable buffer from a HostMemory; reused across saves.
class HostBuffer {
 public:
  explicit HostBuffer(HostMemory* memory) : memory_(memory) {}
  ~HostBuffer() { Release(); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  // Ensures capacity >= bytes; contents are not preserved.
  Status Reserve(std::size_t bytes);
  char* data() const { return data_; }
  std::size_t capacity() const { return capacity_; }

 private:
  void Release();
  HostMemory* memory_;
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace trainguard
