// The kernels the matmul op falls back to when cuBLASLt has no algorithm for an epilogue (or
// refuses it): filling the output with the broadcast bias (BIAS), the bias gradient (BGRADB) and
// the GELU gradient applied in place (DGELU). Private to gpu/src: host launchers only, includable
// from plain C++ (matmul.cpp calls them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"

namespace zo::gpu {

// out (N,OC) written, row stride ld >= OC: every row = bias (OC); the columns past OC are left
// alone. A following GEMM with beta = 1 then adds the product, which rounds once, exactly like
// the BIAS epilogue.
void launch_bias_broadcast(void* out, const void* bias, int N, int OC, int ld, DType t,
                           cudaStream_t s);
inline void launch_bias_broadcast(void* out, const void* bias, int N, int OC, DType t,
                                  cudaStream_t s) {
  launch_bias_broadcast(out, bias, N, OC, OC, t, s);
}

// dbias (OC) += column sums of dout (N,OC; row stride ld >= OC), summed in fp32 in an order fixed
// by (N, OC, scratch_bytes) alone, so results are bit-reproducible. Rows are split into chunks
// whose partial sums go to `scratch` (fp32, device; at most scratch_bytes are used, may be null
// when 0); with no room for two chunks a single pass sums every row.
void launch_bias_backward(void* dbias, const void* dout, int N, int OC, int ld, DType t,
                          float* scratch, std::size_t scratch_bytes, cudaStream_t s);
inline void launch_bias_backward(void* dbias, const void* dout, int N, int OC, DType t,
                                 float* scratch, std::size_t scratch_bytes, cudaStream_t s) {
  launch_bias_backward(dbias, dout, N, OC, OC, t, scratch, scratch_bytes, s);
}

// d (n) = gelu'(pre) * d, in place, with gelu_backward's formula (elementwise.cu).
void launch_gelu_grad_in_place(void* d, const void* pre, std::size_t n, DType t, cudaStream_t s);

}  // namespace zo::gpu
