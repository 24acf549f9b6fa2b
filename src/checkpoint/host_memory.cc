#include "checkpoint/host_memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace trainguard {

namespace {

constexpr std::size_t kHugePage = 2u << 20;

class CpuHostMemory final : public HostMemory {
 public:
  void* Allocate(std::size_t bytes) override {
    std::size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, size);
    if (p == nullptr) return nullptr;
    madvise(p, size, MADV_HUGEPAGE);
    // Fault every page in now, so the first snapshot does not pay for it.
    std::memset(p, 0, size);
    return p;
  }
  void Free(void* p, std::size_t) override { std::free(p); }
  Status WaitFor(void*) override { return Status::Ok(); }
  Status CopyFromDevice(void*, const void*, std::size_t) override {
    return FailedPrecondition("a device tensor was given, but this build has no CUDA or no GPU");
  }
  Status Sync() override { return Status::Ok(); }
  const char* name() const override { return "cpu"; }
};

}  // namespace

std::unique_ptr<HostMemory> MakeCpuHostMemory() { return std::make_unique<CpuHostMemory>(); }

#ifndef TRAINGUARD_WITH_CUDA
std::unique_ptr<HostMemory> MakeHostMemory() { return MakeCpuHostMemory(); }
#endif

Status HostBuffer::Reserve(std::size_t bytes) {
  if (bytes <= capacity_) return Status::Ok();
  Release();
  std::size_t want = bytes + bytes / 8;  // headroom: states grow a little
  void* p = memory_->Allocate(want);
  if (p == nullptr) {
    return IoError("cannot allocate " + std::to_string(want) + " bytes of " + memory_->name() +
                   " host memory for a checkpoint snapshot");
  }
  data_ = static_cast<char*>(p);
  capacity_ = want;
  return Status::Ok();
}

void HostBuffer::Release() {
  if (data_ != nullptr) memory_->Free(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace trainguard
