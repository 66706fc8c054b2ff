// The emulated runtime's memory (cudart_state.h): device allocations over host memory, tracked by
// range with what cudaMemGetInfo reports; page-locking as a registry of ranges; copies and fills,
// asynchronous between device and page-locked memory and waiting for the stream first where the
// host side is pageable (as CUDA's do). A copy in a certainly wrong direction, or an unregister of
// memory never registered, is refused. cudaFree waits for the whole device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "cudart_state.h"
#include "simt.h"
#include "streams.h"

using namespace zo::simt::rt;

namespace {

std::map<const char*, std::size_t> g_device;  // allocation start -> bytes (g_mu)
std::map<const char*, std::size_t> g_pinned;  // cudaHostRegister start -> bytes (g_mu)
std::size_t g_device_used = 0;
std::uint64_t g_device_allocations = 0;  // successful cudaMalloc/cudaMallocAsync calls (g_mu)

bool in_ranges(const std::map<const char*, std::size_t>& ranges, const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = ranges.upper_bound(c);
  if (it == ranges.begin()) return false;
  --it;
  return c < it->first + std::max<std::size_t>(it->second, 1);
}

enum class Where { kDevice, kPinned, kPageable };

Where where_is(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (in_ranges(g_device, p)) return Where::kDevice;
  return in_ranges(g_pinned, p) ? Where::kPinned : Where::kPageable;
}

void* device_alloc(std::size_t size) {
  const std::size_t bytes = (size + 255) / 256 * 256;
  std::lock_guard<std::mutex> lock(g_mu);
  if (bytes == 0 || g_device_used + bytes > kDeviceBytes) return nullptr;
  void* p = std::aligned_alloc(256, bytes);
  if (p == nullptr) return nullptr;
  // All-ones bits (NaN as floats): reading memory no kernel wrote shows up in the results.
  std::memset(p, 0xff, bytes);
  g_device[static_cast<const char*>(p)] = bytes;
  g_device_used += bytes;
  ++g_device_allocations;
  return p;
}

bool device_free(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_device.find(static_cast<const char*>(p));
  if (it == g_device.end()) return false;
  g_device_used -= it->second;
  g_device.erase(it);
  std::free(p);
  return true;
}

// Refuses a copy whose direction is certainly wrong: device memory named as the host side, or
// registered host memory named as the device side. (Other host memory may stand for device
// memory: the kernel tests keep their "device" tensors in ordinary vectors.)
cudaError_t check_copy(const void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  if (count != 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const Where d = where_is(dst), s = where_is(src);
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return s != Where::kDevice && d != Where::kPinned ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return d != Where::kDevice && s != Where::kPinned ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return d != Where::kPinned && s != Where::kPinned ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
      return cudaSuccess;
    default:
      return cudaErrorInvalidMemcpyDirection;
  }
}

// The host side of a copy, if it has one.
const void* host_side(const void* dst, const void* src, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return src;
    case cudaMemcpyDeviceToHost:
      return dst;
    case cudaMemcpyDeviceToDevice:
      return nullptr;
    default:
      if (where_is(dst) != Where::kDevice) return dst;
      return where_is(src) != Where::kDevice ? src : nullptr;
  }
}
}  // namespace

namespace zo::simt {

bool is_device_pointer(const void* p) {
  return where_is(p) == Where::kDevice;
}

std::uint64_t device_allocations() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_device_allocations;
}

}  // namespace zo::simt

extern "C" {

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  *total_bytes = kDeviceBytes;
  *free_bytes = kDeviceBytes - g_device_used;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  *ptr = size == 0 ? nullptr : device_alloc(size);
  return size != 0 && *ptr == nullptr ? record(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  {
    std::unique_lock<std::mutex> lock(g_mu);
    drain(lock, nullptr);  // cudaFree synchronises the device
  }
  return device_free(ptr) ? cudaSuccess : record(cudaErrorInvalidValue);
}

// In a capture CUDA would make graph-owned allocations; the project never allocates while
// capturing (gpu::Stream's scratch exists before), so the emulator refuses, stricter than CUDA.
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (ptr == nullptr || !valid_stream(stream)) return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  *ptr = size == 0 ? nullptr : device_alloc(size);
  return size != 0 && *ptr == nullptr ? record(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return cudaSuccess;
  if (!valid_stream(stream) || !zo::simt::is_device_pointer(ptr))
    return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  zo::simt::enqueue(stream, [ptr] { device_free(ptr); });
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static int the_pool;  // one opaque handle; the attributes set on it change nothing here
  if (pool == nullptr) return record(cudaErrorInvalidValue);
  if (device != 0) return record(cudaErrorInvalidDevice);
  *pool = reinterpret_cast<cudaMemPool_t>(&the_pool);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr, void* value) {
  return pool == nullptr || value == nullptr ? record(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
  return pool == nullptr ? record(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  if (ptr == nullptr || size == 0) return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  const char* c = static_cast<const char*>(ptr);
  if (in_ranges(g_pinned, c) || in_ranges(g_pinned, c + size - 1))
    return record(cudaErrorHostMemoryAlreadyRegistered);
  g_pinned[c] = size;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  std::size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const auto it = g_pinned.find(static_cast<const char*>(ptr));
    if (it == g_pinned.end()) return record(cudaErrorHostMemoryNotRegistered);
    bytes = it->second;
  }
  zo::simt::check_released(ptr, bytes, "page-locked memory (cudaHostUnregister)");
  std::lock_guard<std::mutex> lock(g_mu);
  g_pinned.erase(static_cast<const char*>(ptr));
  return cudaSuccess;
}

// gpu/src/memory_pool.cpp calls it (a weak reference there) for every block its cache takes back.
extern "C" void zo_simt_block_released(const void* p, std::size_t bytes) {
  zo::simt::check_released(p, bytes, "device memory (back to the caching allocator)");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return record(e);
  if (count == 0) return cudaSuccess;
  const void* host = host_side(dst, src, kind);
  if (host != nullptr && where_is(host) == Where::kPageable) {
    // Pageable memory: CUDA waits for the stream, then copies before returning; a graph cannot.
    if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
    const cudaError_t e = synchronize(worker_of(stream));
    if (e != cudaSuccess) return e;
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  zo::simt::enqueue(
      stream, [dst, src, count] { std::memmove(dst, src, count); }, {{dst, count}, {src, count}},
      "a cudaMemcpyAsync");
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return record(e);
  if (const cudaError_t e = synchronize(nullptr); e != cudaSuccess) return e;
  if (count != 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr || where_is(ptr) == Where::kPinned) return record(cudaErrorInvalidValue);
  zo::simt::enqueue(
      stream, [ptr, value, count] { std::memset(ptr, value, count); }, {{ptr, count}},
      "a cudaMemsetAsync");
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr || where_is(ptr) == Where::kPinned) return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = synchronize(nullptr); e != cudaSuccess) return e;
  std::memset(ptr, value, count);
  return cudaSuccess;
}

}  // extern "C"
