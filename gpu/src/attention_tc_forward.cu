// Causal attention forward on tensor cores (bf16/fp16, hs 64 and 128): one block per (b, h, 64
// queries), an online softmax over the key tiles up to the diagonal, K and V double-buffered with
// cp.async. Tiling, memory and the predicted speed: attention_tc.cuh; the launcher that picks this
// kernel: attention_forward.cu.
#include <cmath>
#include <cstdint>

#include "attention_tc.cuh"
#include "gpu/check.h"
#include "launch_util.h"

namespace zo::gpu {
namespace attention_tc {

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_tc_forward_kernel(T* __restrict__ out, float* __restrict__ lse,
                                const T* __restrict__ qkv, const AttentionShape sh) {
  using attention_detail::kLn2;
  constexpr int kLd = ld<kD>();
  constexpr int kTile = kRows * kLd;  // keys per tile = queries per block = 64
  ZO_DYNAMIC_SHARED(float4, attention_smem);
  T* sQ = reinterpret_cast<T*>(attention_smem);  // (64, kLd)
  T* sK = sQ + kTile;                            // 2 x (64, kLd)
  T* sV = sK + 2 * kTile;                        // 2 x (64, kLd)

  const Frame f(sh, /*reverse=*/true);
  const int lane = f.lane, qt = f.bc.tile, q0 = qt * kRows, kv = f.bc.h / sh.group;
  const T* seq = qkv + f.seq0;
  load_tile<T, kRows, kD>(sQ, seq + q0 * f.c3 + f.bc.h * sh.hs, f.c3, min(kRows, sh.T - q0),
                          sh.async16);
  load_kv<T, kRows, kD>(sK, sV, seq, f.c3, kv, 0, 0, sh);
  mma::cp_async_commit();

  // This lane's rows: row0 and row0 + 8 (h = 0, 1); its columns of each 8-key tile j: 8 j + col.
  const int row0 = q0 + 16 * f.warp + lane / 4, col = 2 * (lane % 4);
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // max (log2 units), partial sums
  for (int kt = 0; kt <= qt; ++kt) {
    const int buf = kt & 1, k0 = kt * kRows;
    if (kt < qt) load_kv<T, kRows, kD>(sK, sV, seq, f.c3, kv, kt + 1, buf ^ 1, sh);
    mma::cp_async_commit();  // an empty group on the last tile keeps the count uniform
    mma::cp_async_wait<1>();
    __syncthreads();  // every thread's copies of tile kt are in

    float s[kRows / 8][4] = {};
    mma_abt<T, kD, kRows>(s, sQ, 16 * f.warp, sK + buf * kTile, lane);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * sh.scale_log2;
        if (kt == qt && k0 + 8 * j + col + (e & 1) > row0 + 8 * (e >> 1)) x = -INFINITY;
        s[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float ref[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], quad_max(mx[h]));
      ref[h] = m_new == -INFINITY ? 0.0f : m_new;  // key 0 makes every row finite at kt = 0
      const float alpha = exp2f(m[h] - ref[h]);
      m[h] = m_new;
      l[h] *= alpha;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[j][2 * h] *= alpha;
        o[j][2 * h + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - ref[e >> 1]);
        sum[e >> 1] += s[j][e];
      }
    }
    l[0] += sum[0];
    l[1] += sum[1];
    mma_pm<T, kD, kRows>(o, s, sV + buf * kTile, lane);
    __syncthreads();  // buffer buf is refilled at kt + 1
  }

  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float row_sum = quad_sum(l[h]);
    inv[h] = 1.0f / row_sum;
    const int q = row0 + 8 * h;
    if (lane % 4 == 0 && q < sh.T)
      lse[static_cast<std::int64_t>(f.bc.bh) * sh.T + q] = (m[h] + log2f(row_sum)) * kLn2;
  }
  store_rows<T, false, kD>(out + f.out0, sh.C, o, inv, row0, sh.T, sh.async16, lane);
}

void forward(void* out, float* lse, const void* qkv, const AttentionShape& sh, DType t,
             cudaStream_t s) {
  const AttentionShape tc = block_shape(sh);
  dispatch(t, sh.hs, [&](auto tag, auto size) {
    using T = typename decltype(tag)::type;
    constexpr int kD = decltype(size)::value;
    const std::size_t smem = sizeof(T) * 5 * kRows * ld<kD>();
    attention_detail::launch_tiles("launch_attention_forward", &attention_tc_forward_kernel<T, kD>,
                                   smem, kThreads, sh.NH, tc, s, static_cast<T*>(out), lse,
                                   static_cast<const T*>(qkv));
  });
}

}  // namespace attention_tc
}  // namespace zo::gpu
