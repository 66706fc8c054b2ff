// Decode attention (launch_attention_decode): one query row per sequence, at position `pos`,
// against the cached keys and values of positions [0, pos] of the same qkv buffer: one step of
// incremental generation with a KV cache. Formulas as the host reference
// (src/device/host_ops_attention.cpp, attention_decode).
//
// One block per (b, query head h). The query row is loaded into shared memory; keys go by in
// chunks of kChunk: each warp takes keys in turn and reduces q.k over its lanes (warp_sum), the
// block takes the chunk's maximum and updates an online softmax (running max m and sum l, as
// FlashAttention), then each thread adds p_j v_j into the output dimensions it owns. Memory-bound
// on the cache: each key and value row is read once per query head; deterministic (fixed
// reduction trees, keys in order).

#include <cstdint>
#include <string>

#include "attention.cuh"
#include "block_reduce.cuh"
#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeChunk = 128;  // keys per shared-memory chunk of scores

// Block maximum, returned to every thread; `shared` holds 32 values (as block_sum).
__device__ __forceinline__ float block_max(float v, float* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float m = static_cast<int>(threadIdx.x % 32) < static_cast<int>(blockDim.x / 32)
                ? shared[threadIdx.x % 32]
                : -INFINITY;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  return m;
}

template <typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_kernel(T* __restrict__ out, const T* __restrict__ qkv, int pos,
                            const AttentionShape sh) {
  ZO_DYNAMIC_SHARED(float4, decode_smem);
  float* sq = reinterpret_cast<float*>(decode_smem);  // (hs) the query row
  float* so = sq + sh.hs;                             // (hs) output accumulator
  __shared__ float sp[kDecodeChunk];                  // this chunk's scores, then weights
  __shared__ float red[32];

  const int b = static_cast<int>(blockIdx.x) / sh.NH, h = static_cast<int>(blockIdx.x) % sh.NH;
  const int kv = h / sh.group, lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, warps = kDecodeThreads / 32;
  const std::int64_t ld = sh.ld_qkv;
  const T* seq = qkv + static_cast<std::int64_t>(b) * sh.T * ld;  // position 0's row
  const T* k0 = seq + sh.C + static_cast<std::int64_t>(kv) * sh.hs;
  const T* v0 = k0 + static_cast<std::int64_t>(sh.NKV) * sh.hs;
  for (int d = threadIdx.x; d < sh.hs; d += kDecodeThreads) {
    sq[d] = to_float(seq[pos * ld + static_cast<std::int64_t>(h) * sh.hs + d]);
    so[d] = 0.0f;
  }
  __syncthreads();

  float m = -INFINITY, l = 0.0f;  // running max and sum of exp(score - m), the same in every thread
  for (int j0 = 0; j0 <= pos; j0 += kDecodeChunk) {
    const int n = min(kDecodeChunk, pos + 1 - j0);
    for (int jj = warp; jj < n; jj += warps) {
      const T* k = k0 + (j0 + jj) * ld;
      float acc = 0.0f;
      for (int d = lane; d < sh.hs; d += 32)
        acc += sq[d] * to_float(k[d]);
      acc = warp_sum(acc);
      if (lane == 0) sp[jj] = acc * sh.scale;
    }
    __syncthreads();
    float cmax = -INFINITY;
    for (int jj = threadIdx.x; jj < n; jj += kDecodeThreads)
      cmax = fmaxf(cmax, sp[jj]);
    const float m_new = fmaxf(m, block_max(cmax, red));  // finite: every chunk has a key
    float csum = 0.0f;
    for (int jj = threadIdx.x; jj < n; jj += kDecodeThreads) {
      sp[jj] = expf(sp[jj] - m_new);
      csum += sp[jj];
    }
    const float alpha = expf(m - m_new);  // 0 on the first chunk
    l = l * alpha + block_sum(csum, red);   // block_sum's barrier publishes sp
    m = m_new;
    for (int d = threadIdx.x; d < sh.hs; d += kDecodeThreads) {
      float acc = so[d] * alpha;
      for (int jj = 0; jj < n; ++jj)
        acc += sp[jj] * to_float(v0[(j0 + jj) * ld + d]);
      so[d] = acc;
    }
    __syncthreads();  // sp is rewritten by the next chunk
  }
  T* o = out + (static_cast<std::int64_t>(b) * sh.NH + h) * sh.hs;
  for (int d = threadIdx.x; d < sh.hs; d += kDecodeThreads)
    o[d] = from_float<T>(so[d] / l);
}

void launch_attention_decode(void* out, const void* qkv, int pos, const AttentionDims& d, DType t,
                             cudaStream_t s) {
  constexpr const char* op = "launch_attention_decode";
  const AttentionShape sh = attention_detail::make_shape(op, d, t, {{out, "out"}, {qkv, "qkv"}});
  if (pos < 0 || pos >= d.T) {
    detail::bad_arg(op, "position " + std::to_string(pos) + " is outside the cache's [0, T = " +
                            std::to_string(d.T) + ")");
  }
  const std::size_t smem = 2 * std::size_t(sh.hs) * sizeof(float);
  ZO_DISPATCH_DTYPE(t, T_, {
    ZO_LAUNCH(static_cast<unsigned>(d.B * d.NH), kDecodeThreads, smem, s,
              attention_decode_kernel<T_>)
    (static_cast<T_*>(out), static_cast<const T_*>(qkv), pos, sh);
  });
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace zo::gpu
