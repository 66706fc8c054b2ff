// Owning, move-only device memory (cudaMalloc/cudaFree). Copies between host and device are
// explicit calls, never implicit.
#pragma once

#include <cstddef>

namespace zo::gpu {

class DeviceBuffer {
 public:
  DeviceBuffer() noexcept = default;
  // Allocates `bytes` on the current device (nothing for 0). Throws CudaError naming the request
  // and the device's free/total memory when the allocation fails.
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();  // never throws; a failing cudaFree is reported on stderr

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  void* data() noexcept { return ptr_; }
  const void* data() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return bytes_; }  // in bytes
  bool empty() const noexcept { return bytes_ == 0; }
  int device() const noexcept { return device_; }  // -1 when nothing is allocated

  // The memory as T elements; size() / sizeof(T) of them. cudaMalloc aligns to 256 bytes.
  template <typename T>
  T* as() noexcept {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  const T* as() const noexcept {
    return static_cast<const T*>(ptr_);
  }

  // Blocking copies of `bytes` at byte `offset`; std::out_of_range past the end. They run on the
  // default stream: synchronise other streams that still write this buffer before copy_to_host.
  void copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0);
  void copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0) const;

  void reset() noexcept;  // frees now; the buffer becomes empty

 private:
  void check_range(std::size_t bytes, std::size_t offset, const char* what) const;

  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;
};

}  // namespace zo::gpu
