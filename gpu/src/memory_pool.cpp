// The caching device allocator (gpu/runtime.h, MemoryPool).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "gpu/check.h"
#include "gpu/runtime.h"

// Defined by the SIMT emulator (tests/simt), which checks that no queued work still uses a block
// the cache takes back; a real build has no definition, and the call is skipped.
extern "C" void zo_simt_block_released(const void* p, std::size_t bytes) __attribute__((weak));

namespace zo::gpu {
namespace {

constexpr std::size_t kSmallGranule = 512;                   // below kLargeThreshold
constexpr std::size_t kLargeThreshold = 1u << 20;            // 1 MiB
constexpr std::size_t kLargeGranule = std::size_t{2} << 20;  // 2 MiB

// At most 511 B lost per small block and 2 MiB per large one; 0 bytes still get a distinct block.
// Wraps around only for sizes no device has (size_class() checks).
std::size_t rounded(std::size_t bytes) noexcept {
  const std::size_t g = bytes < kLargeThreshold ? kSmallGranule : kLargeGranule;
  return (std::max<std::size_t>(bytes, 1) + g - 1) / g * g;
}

}  // namespace

std::size_t MemoryPool::size_class(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  if (size < bytes) throw std::length_error("cuda device: allocation size overflows");
  return size;
}

std::shared_ptr<MemoryPool> MemoryPool::open(int device, std::size_t capacity_bytes) {
  const DeviceGuard guard(device);
  // Streams grow their scratch with cudaMallocAsync (Stream::with_scratch) and the matmul's
  // one-off timing takes its output copy the same way: keep freed memory in the stream-ordered
  // pool.
  cudaMemPool_t pool = nullptr;
  ZO_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  std::uint64_t keep = UINT64_MAX;
  ZO_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  std::size_t free_bytes = 0, total_bytes = 0;
  ZO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t margin = std::max<std::size_t>(kDefaultMarginBytes, total_bytes / 50);
  const std::size_t capacity = capacity_bytes == 0 ? (free_bytes > margin ? free_bytes - margin : 0)
                                                   : std::min(capacity_bytes, free_bytes);
  return std::make_shared<MemoryPool>(device, capacity);
}

MemoryPool::MemoryPool(int device, std::size_t capacity) : device_(device), capacity_(capacity) {}

MemoryPool::~MemoryPool() {
  const QuietDeviceGuard guard(device_);
  flush_locked();
}

std::size_t MemoryPool::in_use() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

void* MemoryPool::allocate(std::size_t bytes, const char* what) {
  const std::size_t size = size_class(bytes);
  const std::lock_guard<std::mutex> lock(mu_);
  check_capacity_locked(size, bytes, what);
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    in_use_ += size;
    return p;
  }
  const DeviceGuard guard(device_);
  // A miss. Cached blocks of other sizes count against the capacity as well: drop them first
  // when the new block would not fit beside them.
  if (held_ + scratch_ + size > capacity_) flush_locked();
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, size);
  if (status == cudaErrorMemoryAllocation) {
    // Give back what this process caches: our free lists and the stream-ordered pool's unused
    // memory (flush_locked's cudaFree synchronises, so its pending frees are done).
    (void)cudaGetLastError();
    flush_locked();
    trim_stream_ordered_pool();
    status = cudaMalloc(&p, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemoryError(std::string(what) + " (cudaMalloc failed: memory is held outside " +
                               "this process or fragmented)",
                           bytes, in_use_, capacity_);
  }
  ZO_CUDA_CHECK(status);
  held_ += size;
  in_use_ += size;
  return p;
}

void MemoryPool::deallocate(void* p, std::size_t bytes) noexcept {
  const std::size_t size = rounded(bytes);
  if (zo_simt_block_released != nullptr) zo_simt_block_released(p, size);
  const std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= std::min(in_use_, size);
  try {
    free_[size].push_back(p);
  } catch (...) {  // no memory for the free list: give the block back instead
    const QuietDeviceGuard guard(device_);
    (void)cudaFree(p);
    (void)cudaGetLastError();
    held_ -= std::min(held_, size);
  }
}

void MemoryPool::reserve(std::size_t bytes, const char* what) {
  const std::lock_guard<std::mutex> lock(mu_);
  check_capacity_locked(bytes, bytes, what);
  if (held_ + scratch_ + bytes > capacity_) {
    const QuietDeviceGuard guard(device_);
    flush_locked();
  }
  in_use_ += bytes;
  scratch_ += bytes;
}

void MemoryPool::unreserve(std::size_t bytes) noexcept {
  const std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= std::min(in_use_, bytes);
  scratch_ -= std::min(scratch_, bytes);
}

void MemoryPool::check_capacity_locked(std::size_t size, std::size_t requested,
                                       const char* what) const {
  if (size > capacity_ || in_use_ > capacity_ - size) {
    throw OutOfMemoryError(what, requested, in_use_, capacity_);
  }
}

void MemoryPool::trim_stream_ordered_pool() noexcept {
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) {
    (void)cudaDeviceSynchronize();
    (void)cudaMemPoolTrimTo(pool, 0);
  }
  (void)cudaGetLastError();
}

// cudaFree of every cached block, with the device current; the caller holds mu_ (or is the
// destructor).
void MemoryPool::flush_locked() noexcept {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      if (cudaFree(p) != cudaSuccess) {
        (void)cudaGetLastError();
        std::fprintf(stderr, "warning: cudaFree of a cached device block failed\n");
      }
      held_ -= std::min(held_, size);
    }
  }
  free_.clear();
}

}  // namespace zo::gpu
