// The GPU a CUDA test runs on (the first usable device, queried once per test binary), and
// device memory for tests that call gpu/ directly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "gpu/check.h"
#include "gpu/device.h"
#include "gpu/runtime.h"

namespace zo::test {

// Index of the first device this build can use, or -1 (zo::gpu::no_device_reason() says why).
inline int usable_device() {
  static const int index = [] {
    for (const zo::gpu::DeviceInfo& info : zo::gpu::query_devices()) {
      if (info.usable()) return info.index;
    }
    return -1;
  }();
  return index;
}

// The caching allocator the CUDA backend uses, on usable_device(), without a capacity limit.
// Never destroyed: blocks may still be cached when the CUDA runtime shuts down at exit.
inline const std::shared_ptr<zo::gpu::MemoryPool>& test_pool() {
  static const auto* pool = new std::shared_ptr<zo::gpu::MemoryPool>(
      std::make_shared<zo::gpu::MemoryPool>(usable_device(), ~std::size_t{0}));
  return *pool;
}

// A block of test_pool() for the lifetime of the object, with blocking copies (they wait for
// the whole device, so kernels on any stream see the data and their results are complete).
// Device memory in the product is dev::Buffer (src/device/device.h), over the same allocator.
class GpuBuffer {
 public:
  explicit GpuBuffer(std::size_t bytes)
      : bytes_(bytes), data_(test_pool()->allocate(bytes, "test buffer")) {}
  ~GpuBuffer() { test_pool()->deallocate(data_, bytes_); }
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t size() const { return bytes_; }

  void copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0) {
    ZO_CUDA_CHECK(
        cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
    ZO_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0) const {
    ZO_CUDA_CHECK(cudaDeviceSynchronize());
    ZO_CUDA_CHECK(
        cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
  }

 private:
  std::size_t bytes_;
  void* data_;
};

}  // namespace zo::test
