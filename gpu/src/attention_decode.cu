// Decode attention (launch_attention_decode): one query row per sequence, at position `pos`,
// against the cached keys and values of positions [0, pos] of the same qkv buffer: one step of
// incremental generation with a KV cache. Formulas as the host reference
// (src/device/host_ops_attention.cpp, attention_decode).
//
// One block per (b, query head h, split of the positions). The query row is loaded into shared
// memory; the split's keys go by in chunks of kDecodeChunk: each warp takes keys in turn and
// reduces q.k over its lanes (warp_sum), the block takes the chunk's maximum and updates an
// online softmax (running max m and sum l, as FlashAttention), then each thread adds p_j v_j into
// the output dimensions it owns. Memory-bound on the cache: each key and value row is read once
// per query head; deterministic (fixed reduction trees, keys in order, splits combined in order).
//
// Splits (flash-decoding): at micro-batch 1 there are only NH blocks, a tenth of an H100's SMs,
// so the positions are split until there are about two blocks per SM (never fewer than
// kDecodeMinKeys keys per split). Each split writes its (m, l, unnormalised output) to scratch
// and attention_decode_combine_kernel rescales them to the common maximum and sums them:
//   M = max_s m_s,  L = sum_s l_s e^(m_s - M),  out = sum_s o_s e^(m_s - M) / L.

#include <algorithm>
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
constexpr int kDecodeChunk = 128;   // keys per shared-memory chunk of scores
constexpr int kDecodeMinKeys = 64;  // keys per split at least (a split's keys: a multiple of it)
constexpr int kDecodeMaxSplits = 64;

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

// With one split, out (B, NH hs) is written. With more, part holds per (b, h, split) hs + 2
// floats: m, l, and the output before the division by l.
template <typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_kernel(T* __restrict__ out, float* __restrict__ part,
                            const T* __restrict__ qkv, int pos, int split_keys,
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

  const int j_begin = static_cast<int>(blockIdx.y) * split_keys;
  const int j_end = min(pos + 1, j_begin + split_keys);
  float m = -INFINITY, l = 0.0f;  // running max and sum of exp(score - m), the same in every thread
  for (int j0 = j_begin; j0 < j_end; j0 += kDecodeChunk) {
    const int n = min(kDecodeChunk, j_end - j0);
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
    const float alpha = expf(m - m_new);   // 0 on the first chunk
    l = l * alpha + block_sum(csum, red);  // block_sum's barrier publishes sp
    m = m_new;
    for (int d = threadIdx.x; d < sh.hs; d += kDecodeThreads) {
      float acc = so[d] * alpha;
      for (int jj = 0; jj < n; ++jj)
        acc += sp[jj] * to_float(v0[(j0 + jj) * ld + d]);
      so[d] = acc;
    }
    __syncthreads();  // sp is rewritten by the next chunk
  }
  if (gridDim.y == 1) {
    T* o = out + (static_cast<std::int64_t>(b) * sh.NH + h) * sh.hs;
    for (int d = threadIdx.x; d < sh.hs; d += kDecodeThreads)
      o[d] = from_float<T>(so[d] / l);
    return;
  }
  float* p = part + (static_cast<std::int64_t>(blockIdx.x) * gridDim.y + blockIdx.y) * (sh.hs + 2);
  if (threadIdx.x == 0) {
    p[0] = m;
    p[1] = l;
  }
  for (int d = threadIdx.x; d < sh.hs; d += kDecodeThreads)
    p[2 + d] = so[d];
}

// One block per (b, h): the splits' partial softmaxes rescaled to their common maximum, in order.
template <typename T>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_combine_kernel(T* __restrict__ out, const float* __restrict__ part, int splits,
                                    int hs) {
  const float* p = part + static_cast<std::int64_t>(blockIdx.x) * splits * (hs + 2);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s)
    M = fmaxf(M, p[s * (hs + 2)]);
  float L = 0.0f;
  for (int s = 0; s < splits; ++s)
    L += p[s * (hs + 2) + 1] * expf(p[s * (hs + 2)] - M);
  T* o = out + static_cast<std::int64_t>(blockIdx.x) * hs;
  for (int d = threadIdx.x; d < hs; d += kDecodeThreads) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s)
      acc += p[s * (hs + 2) + 2 + d] * expf(p[s * (hs + 2)] - M);
    o[d] = from_float<T>(acc / L);
  }
}

namespace {

// Splits per (b, h) at most: enough blocks for two per SM where B x NH alone are fewer.
int max_splits(const AttentionDims& d) {
  const int bh = d.B * d.NH;
  const int target =
      2 * detail::device_attribute(cudaDevAttrMultiProcessorCount, detail::current_device());
  // (Bad dimensions get one split here; the launcher's checks name them.)
  return bh <= 0 || bh >= target ? 1 : std::min(kDecodeMaxSplits, detail::ceil_div(target, bh));
}

struct DecodeSplit {
  int count, keys;  // splits of `keys` positions each, the last one shorter
};
DecodeSplit decode_split(const AttentionDims& d, int pos) {
  const int n = pos + 1;
  const int want = std::min(max_splits(d), detail::ceil_div(n, kDecodeMinKeys));
  const int keys = detail::ceil_div(detail::ceil_div(n, want), kDecodeMinKeys) * kDecodeMinKeys;
  return {detail::ceil_div(n, keys), keys};
}

}  // namespace

std::size_t attention_decode_scratch_floats(const AttentionDims& d) {
  const int s = max_splits(d);
  return s == 1 ? 0
                : std::size_t(d.B) * std::size_t(d.NH) * std::size_t(s) * (std::size_t(d.hs) + 2);
}

void launch_attention_decode(void* out, const void* qkv, int pos, const AttentionDims& d, DType t,
                             float* scratch, cudaStream_t s) {
  constexpr const char* op = "launch_attention_decode";
  const AttentionShape sh = attention_detail::make_shape(op, d, t, {{out, "out"}, {qkv, "qkv"}});
  if (pos < 0 || pos >= d.T) {
    detail::bad_arg(op, "position " + std::to_string(pos) +
                            " is outside the cache's [0, T = " + std::to_string(d.T) + ")");
  }
  const DecodeSplit split = decode_split(d, pos);
  if (split.count > 1) detail::check_not_null(op, {{scratch, "scratch"}});
  const std::size_t smem = 2 * std::size_t(sh.hs) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(d.B * d.NH), static_cast<unsigned>(split.count));
  ZO_DISPATCH_DTYPE(t, T_, {
    ZO_LAUNCH(grid, kDecodeThreads, smem, s, attention_decode_kernel<T_>)
    (static_cast<T_*>(out), scratch, static_cast<const T_*>(qkv), pos, split.keys, sh);
    ZO_CUDA_CHECK_LAUNCH();
    if (split.count > 1) {
      ZO_LAUNCH(static_cast<unsigned>(d.B * d.NH), kDecodeThreads, 0, s,
                attention_decode_combine_kernel<T_>)
      (static_cast<T_*>(out), scratch, split.count, sh.hs);
      ZO_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace zo::gpu
