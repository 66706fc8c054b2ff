// Rotary position embedding (RoFormer, arXiv 2104.09864) in Hugging Face's rotate_half layout,
// in place on the q and k heads of a fused qkv buffer; formulas as the host reference
// (src/device/host_ops_llama.cpp). qkv (B, T, (NH + 2 NKV) hs) per token as
// [q (NH heads) | k (NKV heads) | v (NKV heads)]: the q and k heads are the first NH + NKV heads
// of each row. inv_freq (hs / 2) fp32.
//
// One thread per (token, q or k head, pair i < hs/2), grid-stride: it rotates (x_i, x_{i+hs/2})
// by the angle t * inv_freq[i] (t: pos0 + the token's row in its sequence; fp32 product, then
// fp32 sincosf, as Hugging Face's fp32 cos/sin), or by its negative for the backward (the
// transpose). Each element is read and written by one thread. Memory-bound and scalar: two T
// loads and stores per thread.

#include <cstddef>
#include <cstdint>
#include <string>

#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kRopeThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_kernel(T* __restrict__ qkv, const float* __restrict__ inv_freq, std::int64_t pairs, int T_,
                int pos0, int heads, int ld, int hs, float sign) {
  const int half = hs / 2;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < pairs; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const std::int64_t rest = idx / half;
    const int h = static_cast<int>(rest % heads);
    const std::int64_t tok = rest / heads;
    const float angle = static_cast<float>(pos0 + tok % T_) * inv_freq[i];
    float sn, cs;
    sincosf(angle, &sn, &cs);
    sn *= sign;
    T* x = qkv + tok * ld + static_cast<std::int64_t>(h) * hs;
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    x[i] = from_float<T>(x1 * cs - x2 * sn);
    x[i + half] = from_float<T>(x2 * cs + x1 * sn);
  }
}

namespace {

void launch_rope(const char* op, void* qkv, const float* inv_freq, const AttentionDims& d,
                 bool inverse, DType t, cudaStream_t s) {
  detail::check_dtype(op, t);
  const std::string shape = "B = " + std::to_string(d.B) + ", T = " + std::to_string(d.T) +
                            ", NH = " + std::to_string(d.NH) + ", NKV = " + std::to_string(d.NKV) +
                            ", hs = " + std::to_string(d.hs);
  if (d.B <= 0 || d.T <= 0 || d.NH <= 0 || d.NKV <= 0 || d.hs <= 0 || d.hs % 2 != 0 ||
      d.pos0 < 0) {
    detail::bad_arg(op, "B, T, NH, NKV and hs must be > 0, hs even and pos0 >= 0 (" + shape +
                            ", pos0 = " + std::to_string(d.pos0) + ")");
  }
  detail::check_not_null(op, {{qkv, "qkv"}, {inv_freq, "inv_freq"}}, [&] { return shape; });
  const int heads = d.NH + d.NKV;
  const std::int64_t pairs = std::int64_t{d.B} * d.T * heads * (d.hs / 2);
  const int ld = (d.NH + 2 * d.NKV) * d.hs;
  const float sign = inverse ? -1.0f : 1.0f;
  ZO_DISPATCH_DTYPE(t, T, {
    ZO_LAUNCH(detail::fill_grid(static_cast<std::size_t>(pairs), kRopeThreads), kRopeThreads, 0, s,
              rope_kernel<T>)
    (static_cast<T*>(qkv), inv_freq, pairs, d.T, d.pos0, heads, ld, d.hs, sign);
  });
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_rope_forward(void* qkv, const float* inv_freq, const AttentionDims& d, DType t,
                         cudaStream_t s) {
  launch_rope("launch_rope_forward", qkv, inv_freq, d, false, t, s);
}

void launch_rope_backward(void* dqkv, const float* inv_freq, const AttentionDims& d, DType t,
                          cudaStream_t s) {
  launch_rope("launch_rope_backward", dqkv, inv_freq, d, true, t, s);
}

}  // namespace zo::gpu
