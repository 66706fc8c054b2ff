// Element-type conversion of device arrays: the host launcher, includable from plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"

namespace zo::gpu {

// dst[i] = src[i] converted from src_t to dst_t for i < n, on `stream` (asynchronous).
// Narrowing rounds to nearest, ties to even, keeps subnormals and overflows to infinity, bit for
// bit as zo::float_to_half / zo::float_to_bf16 (NaNs stay NaN; their payload may differ).
// fp16 <-> bf16 goes through fp32, so it rounds once. Equal types are a device-to-device copy.
// Both arrays must be device-accessible and must not overlap (unless src == dst, same type).
// Throws std::invalid_argument for null pointers with n > 0, overlap or an invalid DType.
void launch_cast(const void* src, zo::DType src_t, void* dst, zo::DType dst_t, std::size_t n,
                 cudaStream_t stream);

}  // namespace zo::gpu
