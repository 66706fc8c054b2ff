// The bias parts of the matmul op that cuBLASLt's epilogues do not cover: filling the output with
// the broadcast bias (when the BIAS epilogue has no algorithm for the operands' alignment) and the
// accumulating bias gradient (the BGRADB epilogue overwrites; the Device interface needs +=).
// Host launchers only, includable from plain C++ (gpu/src/matmul.cpp calls them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"

namespace zo::gpu {

// out (N,OC) written: every row = bias (OC). A following GEMM with beta = 1 then adds the product,
// which rounds once, exactly like the BIAS epilogue.
void launch_bias_broadcast(void* out, const void* bias, int N, int OC, DType t, cudaStream_t s);

// dbias (OC) += column sums of dout (N,OC), summed in fp32 in an order fixed by (N, OC,
// scratch_bytes) alone, so results are bit-reproducible. Rows are split into chunks whose partial
// sums go to `scratch` (fp32, device; at most scratch_bytes are used, may be null when 0); with
// no room for two chunks a single pass sums every row.
void launch_bias_backward(void* dbias, const void* dout, int N, int OC, DType t, float* scratch,
                          std::size_t scratch_bytes, cudaStream_t s);

}  // namespace zo::gpu
