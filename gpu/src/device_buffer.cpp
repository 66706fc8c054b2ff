#include "gpu/device_buffer.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/bytes.h"
#include "gpu/check.h"

namespace zo::gpu {

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  int device = -1;
  void* ptr = nullptr;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) {
    status = cudaMalloc(&ptr, bytes);
  } else {
    device = -1;
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not by the next launch check
    std::ostringstream msg;
    msg << "cudaMalloc of " << bytes << " bytes (" << format_bytes(bytes) << ") failed";
    if (device >= 0) msg << " on device " << device;
    msg << " with " << cuda_error_text(status);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      msg << "; " << format_bytes(free_bytes) << " free of " << format_bytes(total_bytes);
    }
    (void)cudaGetLastError();
    if (const char* hint = detail::cuda_error_hint(status); *hint != '\0') msg << "; " << hint;
    throw CudaError(status, msg.str());
  }
  ptr_ = ptr;
  bytes_ = bytes;
  device_ = device;
}

DeviceBuffer::~DeviceBuffer() {
  reset();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(other.ptr_), bytes_(other.bytes_), device_(other.device_) {
  other.ptr_ = nullptr;
  other.bytes_ = 0;
  other.device_ = -1;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
    other.device_ = -1;
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (ptr_ == nullptr) return;
  const cudaError_t status = cudaFree(ptr_);  // any current device will do under UVA
  // At process exit the runtime may already be torn down; the driver reclaims memory then.
  if (status != cudaSuccess && status != cudaErrorCudartUnloading) {
    std::fprintf(stderr,
                 "offload_train: warning: cudaFree of %zu bytes on device %d failed: %s (%s)\n",
                 bytes_, device_, cudaGetErrorName(status), cudaGetErrorString(status));
  }
  (void)cudaGetLastError();
  ptr_ = nullptr;
  bytes_ = 0;
  device_ = -1;
}

void DeviceBuffer::check_range(std::size_t bytes, std::size_t offset, const char* what) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    throw std::out_of_range(std::string("DeviceBuffer::") + what + ": " + std::to_string(bytes) +
                            " bytes at offset " + std::to_string(offset) + " exceed the buffer's " +
                            std::to_string(bytes_) + " bytes");
  }
}

void DeviceBuffer::copy_from_host(const void* src, std::size_t bytes, std::size_t offset) {
  check_range(bytes, offset, "copy_from_host");
  if (bytes == 0) return;
  if (src == nullptr) throw std::invalid_argument("DeviceBuffer::copy_from_host: src is null");
  ZO_CUDA_CHECK(
      cudaMemcpy(static_cast<std::byte*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA lands; wait, so that kernels on
  // non-blocking streams see the data.
  ZO_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t bytes, std::size_t offset) const {
  check_range(bytes, offset, "copy_to_host");
  if (bytes == 0) return;
  if (dst == nullptr) throw std::invalid_argument("DeviceBuffer::copy_to_host: dst is null");
  ZO_CUDA_CHECK(
      cudaMemcpy(dst, static_cast<const std::byte*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace zo::gpu
