// Host-side helpers shared by the launchers in gpu/src/*.cu: argument checks that throw
// std::invalid_argument naming the op, pointer alignment, grid sizing and stream-ordered scratch.
// Private to gpu/ (not installed with the public headers).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "core/dtype.h"
#include "gpu/check.h"

// `kernel<<<grid, block, smem, stream>>>(args...)` is spelled
// `ZO_LAUNCH(grid, block, smem, stream, kernel)(args...)` in gpu/src, so that the SIMT emulator
// (tests/simt) can run the launchers on a CPU: it defines ZO_LAUNCH before this header.
#ifndef ZO_LAUNCH
#define ZO_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#endif

// The kernels' dynamic shared memory (the SIMT emulator in tests/simt defines it its own way).
#ifndef ZO_DYNAMIC_SHARED
#define ZO_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace zo::gpu::detail {

// A pointer argument with its parameter name, for the null checks.
struct Named {
  const void* p;
  const char* name;
};

// Throws std::invalid_argument("<op>: <what>").
[[noreturn]] inline void bad_arg(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// True for the storage types the kernels are instantiated for.
inline bool valid_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Throws "<op>: invalid DType value <t>" unless valid_dtype(t).
inline void check_dtype(const char* op, DType t) {
  if (!valid_dtype(t)) bad_arg(op, "invalid DType value " + std::to_string(static_cast<int>(t)));
}

// Throws "<op>: <name> is null" for the first null pointer of `ptrs`.
inline void check_not_null(const char* op, std::initializer_list<Named> ptrs) {
  for (const Named& p : ptrs) {
    if (p.p == nullptr) bad_arg(op, std::string(p.name) + " is null");
  }
}

// Throws "<op>: <name> is null (<context()>)" for the first null pointer of `ptrs`; `context`
// (returning the sizes as a std::string) is only called when one is null.
template <typename Context>
void check_not_null(const char* op, std::initializer_list<Named> ptrs, Context&& context) {
  for (const Named& p : ptrs) {
    if (p.p == nullptr) bad_arg(op, std::string(p.name) + " is null (" + context() + ")");
  }
}

// "<n> elements", the context of the flat ops' messages.
inline std::string elements(std::size_t n) {
  return std::to_string(n) + " elements";
}

// Ops over n elements: false when n == 0 (nothing to launch). Throws for an invalid dtype or a
// null pointer ("<op>: <name> is null (<n> elements)").
inline bool check_flat_args(const char* op, std::size_t n, DType t,
                            std::initializer_list<Named> ptrs) {
  check_dtype(op, t);
  if (n == 0) return false;
  check_not_null(op, ptrs, [n] { return elements(n); });
  return true;
}

// Ops over N rows of C columns (`c_name` in the messages): false when N == 0 (nothing to do).
// Throws for N < 0 and for C <= 0, `why` saying what a row needs its columns for.
inline bool check_rows(const char* op, int N, int C, const char* c_name, const char* why,
                       const std::string& shape) {
  if (N < 0) bad_arg(op, "negative row count (" + shape + ")");
  if (N == 0) return false;
  if (C <= 0) bad_arg(op, std::string(c_name) + " must be > 0, " + why + " (" + shape + ")");
  return true;
}

inline bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

template <typename I>
constexpr I ceil_div(I a, I b) {
  return (a + b - 1) / b;
}

inline std::size_t round_up(std::size_t bytes, std::size_t to) {
  return ceil_div(bytes, to) * to;
}

inline int current_device() {
  int device = 0;
  ZO_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory on `device`
// (cudaFuncAttributeMaxDynamicSharedMemorySize), calling the runtime only the first time a
// kernel needs that much there. Why once: cudaFuncSetAttribute is reported to wait for the
// runtime's queued host-device copies, which at every launch would stall the copies the offload
// engine overlaps with compute, and inside a CUDA Graph recording it is best not called at all.
void opt_in_shared_memory(int device, const void* kernel, std::size_t bytes);

inline int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  ZO_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// Blocks of `block_threads` for `threads_needed` threads, capped at enough blocks to fill the
// current GPU once (2048 resident threads per SM on sm_80/sm_90); grid-stride loops cover the rest.
inline int fill_grid(std::size_t threads_needed, int block_threads) {
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, current_device());
  const auto threads = static_cast<std::size_t>(block_threads);
  const std::size_t wanted = ceil_div(threads_needed, threads);
  const std::size_t cap = static_cast<std::size_t>(std::max(sms, 1)) * (2048 / threads);
  return static_cast<int>(std::clamp<std::size_t>(wanted, 1, cap));
}

}  // namespace zo::gpu::detail
