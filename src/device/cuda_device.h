// The CUDA backend of zo::dev::Device (DESIGN.md §4): gpu/'s launchers on non-blocking CUDA
// streams, timing CUDA events, and a caching allocator under a capacity. Only built with CUDA
// (ZO_HAVE_CUDA); the options struct is always visible so that configuration code compiles
// either way.
#pragma once

#include <cstddef>
#include <memory>

#include "core/dtype.h"
#include "device/device.h"

namespace zo::dev {

inline constexpr std::size_t kDefaultMarginBytes = std::size_t{512} << 20;

struct CudaDeviceOptions {
  int device = 0;                  // CUDA runtime ordinal (after CUDA_VISIBLE_DEVICES)
  DType act_dtype = DType::kBF16;  // kBF16 or kF16 to train; kF32 to compare with the host backend
  // 0: the memory free at creation less a margin (kDefaultMarginBytes or 2% of the total, the
  // larger) for NCCL and other allocations outside the pool; else min(this, free memory).
  std::size_t capacity_bytes = 0;
};

#ifdef ZO_HAVE_CUDA
// Opens device `options.device` and allocates the cuBLASLt context (32 MiB workspace) before
// measuring free memory. Throws std::out_of_range for an index that is not visible,
// std::runtime_error when the GPU is missing or unusable (the message says why and what to do)
// and std::invalid_argument for an unknown dtype.
//
// Memory: alloc() reuses freed blocks of the same rounded size (512 B granules below 1 MiB,
// 2 MiB above) and calls cudaMalloc only on a miss; used_bytes() counts the rounded sizes.
// Like the host backend, a Buffer may only be released once no queued work uses it.
// Streams are non-blocking CUDA streams; ops validate arguments eagerly (std::invalid_argument)
// and kernel faults surface at the next synchronize as zo::gpu::CudaError.
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options);
// The cudaStream_t behind a stream of a CUDA device (for NCCL); throws for other streams.
void* cuda_stream_handle(Stream& s);
#endif

}  // namespace zo::dev
