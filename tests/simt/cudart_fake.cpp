// The few CUDA runtime calls gpu/src's launchers make, over host memory, for the SIMT emulator
// (tests/simt/simt.h). The emulated test links this instead of libcudart, so a launcher calling
// anything else fails to link, which is the signal to add it here.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "simt.h"

namespace {
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}
}  // namespace

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    default:
      return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return record(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return record(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || device != 0) return record(cudaErrorInvalidValue);
  const zo::simt::DeviceLimits& l = zo::simt::limits();
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = l.sm_count;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = l.max_shared_optin;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = l.max_shared_default;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = l.max_threads_per_block;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = l.warp_size;
      return cudaSuccess;
    default:
      return record(cudaErrorInvalidValue);
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return record(cudaErrorInvalidValue);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > zo::simt::limits().max_shared_optin)
    return record(cudaErrorInvalidValue);
  zo::simt::set_max_dynamic_shared(func, value);
  return cudaSuccess;
}

// Fresh allocations are filled with all-ones bits (NaN as floats), so reading memory no kernel
// wrote shows up in the results.
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  const size_t bytes = (size + 255) / 256 * 256;
  *ptr = bytes == 0 ? nullptr : std::aligned_alloc(256, bytes);
  if (bytes != 0 && *ptr == nullptr) return record(cudaErrorMemoryAllocation);
  if (*ptr != nullptr) std::memset(*ptr, 0xff, bytes);
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind,
                            cudaStream_t) {
  if (count != 0 && (dst == nullptr || src == nullptr)) return record(cudaErrorInvalidValue);
  if (count != 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t) {
  if (count != 0 && ptr == nullptr) return record(cudaErrorInvalidValue);
  if (count != 0) std::memset(ptr, value, count);
  return cudaSuccess;
}

}  // extern "C"
