// Causal attention backward on tensor cores (bf16/fp16, hs 64 and 128), after the D kernel of
// attention_backward.cu: dK/dV per 64 keys over the query tiles from the diagonal on, then dQ
// per 64 queries over the key tiles up to the diagonal, each with its loop's tiles
// double-buffered by cp.async. Tiling, memory and the predicted speed: attention_tc.cuh.
#include <cstdint>

#include "attention_tc.cuh"
#include "gpu/check.h"
#include "launch_util.h"

namespace zo::gpu {
namespace attention_tc {

// The backward kernels' operands: dqkv written, the rest read.
template <typename T>
struct Grads {
  T* dqkv;
  const T *dout, *qkv;
  const float *lse, *D;
};

// dK, dV: one block per (b, kv head, 64 keys), looping over the query tiles from the diagonal on
// of each query head of the kv head's group in turn; warp w owns keys 16w..16w+15 and works in
// the transposed frame (rows = keys), so that dK and dV accumulate in its registers.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_tc_dkv_kernel(const Grads<T> g, const AttentionShape sh) {
  constexpr int kN = loop_rows<kD>(), kLd = ld<kD>();
  ZO_DYNAMIC_SHARED(float4, attention_smem);
  T* sK = reinterpret_cast<T*>(attention_smem);              // (64, kLd)
  T* sV = sK + kRows * kLd;                                  // (64, kLd)
  T* sQ = sV + kRows * kLd;                                  // 2 x (kN, kLd)
  T* sdO = sQ + 2 * kN * kLd;                                // 2 x (kN, kLd)
  float* sL = reinterpret_cast<float*>(sdO + 2 * kN * kLd);  // 2 x kN: lse
  float* sD = sL + 2 * kN;                                   // 2 x kN: D

  const Frame f(sh, /*reverse=*/false, /*kv_blocks=*/true);
  const int lane = f.lane, k0 = f.bc.tile * kRows, kv = f.bc.h;
  const std::int64_t c3 = f.c3;
  const T* seq = g.qkv + f.seq0;
  const int first = k0 / kN, q_tiles = (sh.T + kN - 1) / kN - first, tiles = sh.group * q_tiles;
  // Step i: query head kv * group + i / q_tiles, query tile first + i % q_tiles.
  auto query0 = [&](int i) { return (first + i % q_tiles) * kN; };
  auto load_q = [&](int i, int buf) {
    const int h = kv * sh.group + i / q_tiles, q0 = query0(i), rows = min(kN, sh.T - q0);
    const std::int64_t bh = static_cast<std::int64_t>(f.bc.b) * sh.NH + h,
                       tok = static_cast<std::int64_t>(f.bc.b) * sh.T + q0;
    load_tile<T, kN, kD>(sQ + buf * kN * kLd, seq + q0 * c3 + h * sh.hs, c3, rows, sh.async16);
    load_tile<T, kN, kD>(sdO + buf * kN * kLd, g.dout + tok * sh.C + h * sh.hs, sh.C, rows,
                         sh.async16);
    load_rows<kN>(sL + buf * kN, g.lse + bh * sh.T + q0, rows);
    load_rows<kN>(sD + buf * kN, g.D + bh * sh.T + q0, rows);
  };
  const int k_rows = min(kRows, sh.T - k0);
  load_tile<T, kRows, kD>(sK, seq + attention_detail::k_col(sh, kv) + k0 * c3, c3, k_rows,
                          sh.async16);
  load_tile<T, kRows, kD>(sV, seq + attention_detail::v_col(sh, kv) + k0 * c3, c3, k_rows,
                          sh.async16);
  load_q(0, 0);
  mma::cp_async_commit();

  // This lane's keys: key0 and key0 + 8; its queries of each 8-query tile j: 8 j + col.
  const int key0 = k0 + 16 * f.warp + lane / 4, col = 2 * (lane % 4);
  float dk[kD / 8][4] = {}, dv[kD / 8][4] = {};
  for (int i = 0; i < tiles; ++i) {
    const int buf = i & 1, q0 = query0(i);
    if (i + 1 < tiles) load_q(i + 1, buf ^ 1);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();
    const T* q = sQ + buf * kN * kLd;
    const T* o = sdO + buf * kN * kLd;
    const float* L = sL + buf * kN;
    const float* Dq = sD + buf * kN;

    float p[kN / 8][4] = {}, ds[kN / 8][4] = {};  // S^T, then P^T; dP^T, then dS^T
    mma_abt<T, kD, kN>(p, sK, 16 * f.warp, q, lane);
    mma_abt<T, kD, kN>(ds, sV, 16 * f.warp, o, lane);
    // Masked: a key after its query (tiles that reach the diagonal), a query at or past T.
    const bool mask = k0 + kRows - 1 > q0 || q0 + kN > sh.T;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = 8 * j + col + (e & 1), query = q0 + qc;
        const bool live = !mask || (key0 + 8 * (e >> 1) <= query && query < sh.T);
        const float pv =
            live ? exp2f(p[j][e] * sh.scale_log2 - L[qc] * attention_detail::kLog2e) : 0.0f;
        p[j][e] = pv;
        ds[j][e] = pv * (ds[j][e] - Dq[qc]);
      }
    }
    mma_pm<T, kD, kN>(dv, p, o, lane);   // dV += P^T dO
    mma_pm<T, kD, kN>(dk, ds, q, lane);  // dK += dS^T Q
    __syncthreads();                     // buffer buf is refilled at i + 1
  }

  T* dst = g.dqkv + f.seq0;
  const float dk_scale[2] = {sh.scale, sh.scale}, one[2] = {1.0f, 1.0f};
  store_rows<T, false, kD>(dst + attention_detail::k_col(sh, kv), c3, dk, dk_scale, key0, sh.T,
                           sh.async16, lane);
  store_rows<T, false, kD>(dst + attention_detail::v_col(sh, kv), c3, dv, one, key0, sh.T,
                           sh.async16, lane);
}

// dQ: one block per (b, h, 64 queries); same frame as the forward kernel, dS in place of P.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_tc_dq_kernel(const Grads<T> g, const AttentionShape sh) {
  constexpr int kN = loop_rows<kD>(), kLd = ld<kD>();
  ZO_DYNAMIC_SHARED(float4, attention_smem);
  T* sQ = reinterpret_cast<T*>(attention_smem);  // (64, kLd)
  T* sdO = sQ + kRows * kLd;                     // (64, kLd)
  T* sK = sdO + kRows * kLd;                     // 2 x (kN, kLd)
  T* sV = sK + 2 * kN * kLd;                     // 2 x (kN, kLd)

  const Frame f(sh, /*reverse=*/true);
  const int lane = f.lane, q0 = f.bc.tile * kRows, q_rows = min(kRows, sh.T - q0);
  const int kv = f.bc.h / sh.group;
  const T* seq = g.qkv + f.seq0;
  load_tile<T, kRows, kD>(sQ, seq + q0 * f.c3 + f.bc.h * sh.hs, f.c3, q_rows, sh.async16);
  load_tile<T, kRows, kD>(sdO, g.dout + f.out0 + static_cast<std::int64_t>(q0) * sh.C, sh.C, q_rows,
                          sh.async16);
  load_kv<T, kN, kD>(sK, sV, seq, f.c3, kv, 0, 0, sh);
  mma::cp_async_commit();

  const int row0 = q0 + 16 * f.warp + lane / 4, col = 2 * (lane % 4);
  float L[2], Dr[2];  // this lane's rows' lse (log2 units) and D; 0 past T (never stored)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int q = row0 + 8 * h;
    const std::int64_t at = static_cast<std::int64_t>(f.bc.bh) * sh.T + q;
    L[h] = q < sh.T ? g.lse[at] * attention_detail::kLog2e : 0.0f;
    Dr[h] = q < sh.T ? g.D[at] : 0.0f;
  }
  const int tiles = (q0 + q_rows - 1) / kN + 1;  // key tiles up to the last query
  float dq[kD / 8][4] = {};
  for (int kt = 0; kt < tiles; ++kt) {
    const int buf = kt & 1, k0 = kt * kN;
    if (kt + 1 < tiles) load_kv<T, kN, kD>(sK, sV, seq, f.c3, kv, kt + 1, buf ^ 1, sh);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    __syncthreads();
    const T* k = sK + buf * kN * kLd;

    float ds[kN / 8][4] = {}, dp[kN / 8][4] = {};  // S, then dS; dP
    mma_abt<T, kD, kN>(ds, sQ, 16 * f.warp, k, lane);
    mma_abt<T, kD, kN>(dp, sdO, 16 * f.warp, sV + buf * kN * kLd, lane);
    const bool mask = k0 + kN - 1 > q0;  // some key of the tile after some query of the block
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool live = !mask || k0 + 8 * j + col + (e & 1) <= row0 + 8 * (e >> 1);
        const float p = live ? exp2f(ds[j][e] * sh.scale_log2 - L[e >> 1]) : 0.0f;
        ds[j][e] = p * (dp[j][e] - Dr[e >> 1]);
      }
    }
    mma_pm<T, kD, kN>(dq, ds, k, lane);  // dQ += dS K
    __syncthreads();                     // buffer buf is refilled at kt + 1
  }

  const float scale[2] = {sh.scale, sh.scale};
  store_rows<T, false, kD>(g.dqkv + f.seq0 + f.bc.h * sh.hs, f.c3, dq, scale, row0, sh.T,
                           sh.async16, lane);
}

void backward(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D,
              const AttentionShape& sh, DType t, cudaStream_t s) {
  constexpr const char* op = "launch_attention_backward";
  const AttentionShape tc = block_shape(sh);
  dispatch(t, sh.hs, [&](auto tag, auto size) {
    using T = typename decltype(tag)::type;
    constexpr int kD = decltype(size)::value, kN = loop_rows<kD>();
    const std::size_t dkv_smem =
        sizeof(T) * (2 * kRows + 4 * kN) * ld<kD>() + sizeof(float) * 4 * kN;
    const std::size_t dq_smem = sizeof(T) * (2 * kRows + 4 * kN) * ld<kD>();
    const Grads<T> g{static_cast<T*>(dqkv), static_cast<const T*>(dout), static_cast<const T*>(qkv),
                     lse, D};
    // dK/dV and dQ write disjoint parts of dqkv, so their order does not matter.
    attention_detail::launch_tiles(op, &attention_tc_dkv_kernel<T, kD>, dkv_smem, kThreads, sh.NKV,
                                   tc, s, g);
    attention_detail::launch_tiles(op, &attention_tc_dq_kernel<T, kD>, dq_smem, kThreads, sh.NH, tc,
                                   s, g);
  });
}

}  // namespace attention_tc
}  // namespace zo::gpu
