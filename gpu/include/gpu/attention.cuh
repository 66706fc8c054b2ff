// Causal multi-head self-attention kernels (launchers in gpu/src/attention.cu, declared in
// gpu/ops.h). FlashAttention-2 style (Dao, arXiv 2307.08691): the (B,NH,T,T) score matrix is never
// stored; keys are visited in tiles with an online softmax, and only the per-row log-sum-exp is
// kept for the backward pass, which recomputes the probabilities from it.
//
// Definitions (those of the fp32 host reference, src/device/host_ops.cpp):
//   qkv (B,T,3C) = [q | k | v] per token; head h uses channels [h*hs, (h+1)*hs), hs = C/NH.
//   s_ij = (q_i . k_j) / sqrt(hs) for j <= i (causal), P = softmax_j(s), out_i = sum_j P_ij v_j.
//   lse_i = log(sum_{j<=i} exp(s_ij)) (natural log, of the scaled scores), (B,NH,T) fp32.
//   Backward (Algorithm 2): D_i = dout_i . out_i, dP = dout V^T, dS = P o (dP - D),
//   dq = scale dS K, dk = scale dS^T Q, dv = P^T dout, all added (+=) into dqkv (B,T,3C).
// Storage type T is float, __half or __nv_bfloat16; every product and sum is fp32. Exponentials
// use exp2f on scores pre-multiplied by log2(e)/sqrt(hs); lse is converted back to natural log.
//
// Tiling. Every kernel works on one (batch, head) pair and one tile of kTile query or key rows,
// with kTile*4 threads: thread (ty, tx) = (tid / 16, tid % 16).
//   - Score tiles (kTile x kTile, reduction over hs): the thread computes 4 contiguous rows
//     4ty..4ty+3 against the kTile/16 interleaved columns tx, tx+16, ... Interleaving keeps the
//     16 threads that share a row in one half-warp, so row maxima reduce with 4 xor-shuffles.
//   - Output tiles (kTile x hs, reduction over the tile's other axis): the same 4 rows against the
//     float4 column chunks tx, tx+16 (kChunks of them), so the per-row softmax state of the score
//     phase stays in the thread. The probabilities go through shared memory, stored transposed
//     ([key][query] in the forward pass) so that the thread reads its 4 rows as one float4.
//   - Head-dimension tiles live in shared memory as fp32 (kTile, ld): ld = 4*ceil(hs/4) rounded
//     so that ld/4 is odd, which makes the float4 reads of 8 different rows by a quarter-warp hit 8
//     different bank groups (no conflicts); the probability tiles use ld = kTile + 4 for the same
//     reason. Rows past T and columns in [hs, 4*ceil(hs/4)) are zero-filled on load.
//   - Configurations: hs <= 64 -> kTile 64, 256 threads, kChunks 1 (GPT-2: hs = 64);
//     64 < hs <= 128 -> kTile 32, 128 threads, kChunks 2. Any hs in [1, 128] works (chunks past
//     hs are clamped to a valid column and never stored); larger heads are rejected.
//   - Causality: query and key tiles have the same size and alignment, so key tiles past the
//     diagonal are skipped entirely and only the diagonal tile is masked; every query row sees at
//     least key 0 of its first tile, so the running maximum is finite after the first tile.
//   - Grid: 1-D, B*NH*ceil(T/kTile) blocks, ordered so that the blocks with the most tiles to
//     visit (late query tiles forward and for dq, early key tiles for dk/dv) start first.
//
// Kernels, shared memory (fp32), registers (most over the dtypes; nvcc 13, sm_90) and resident
// blocks per H100 SM, for hs = 64 (kTile 64) / hs = 128 (kTile 32):
//   forward    per query tile, loops key tiles <= it: Q, K, V (kTile x ld) + P^T (kTile x kTile+4)
//                                         68.0 KiB,  80 regs, 3 blocks / 54.0 KiB, 108 regs, 4
//   bwd D      one warp per (b, h, t) row: D = dout . out into `scratch`; no shared memory, 56 regs
//   bwd dk/dv  per key tile, loops query tiles >= it: K, V, Q, dout + P, dS + lse, D (kTile each)
//                                        102.5 KiB, 128 regs, 2 blocks / 75.3 KiB, 154 regs, 2
//   bwd dq     per query tile, loops key tiles <= it: Q, dout, K, V + dS^T + lse, D
//                                         85.5 KiB, 126 regs, 2 blocks / 70.8 KiB, 124 regs, 3
// Above 48 KiB (all of the above; small heads may fit) the launchers opt in with
// cudaFuncSetAttribute (cudaFuncAttributeMaxDynamicSharedMemorySize; sm_80 allows 163 KiB per
// block, sm_90 227 KiB) and throw std::invalid_argument if the device's opt-in limit is smaller.
// __launch_bounds__ carries the block counts above so that ptxas budgets registers for them; no
// kernel spills. The backward pass computes dk/dv and dq in separate kernels (scores recomputed in
// each) so each dqkv element is read-modified-written exactly once, by one thread: no atomics,
// deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/cast.cuh"

// The kernels' dynamic shared memory (the SIMT emulator in tests/simt defines it its own way).
#ifndef ZO_DYNAMIC_SHARED
#define ZO_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace zo::gpu {

// Problem shape and derived tiling constants, computed once on the host.
struct AttentionShape {
  int B, T, C, NH, hs;
  int n4;            // ceil(hs / 4): float4 chunks per head row
  int ld;            // shared-memory row stride (floats) of head-dimension tiles; ld / 4 odd
  int n_tiles;       // ceil(T / kTile)
  float scale;       // 1 / sqrt(hs)
  float scale_log2;  // log2(e) / sqrt(hs)
  bool vec;          // 4-element global accesses are aligned (hs % 4 == 0, aligned pointers)
};

namespace attention_detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Blocks per SM that shared memory allows on sm_90 (table above), passed to __launch_bounds__ so
// that ptxas budgets registers for that occupancy; its default for one-argument bounds spilled.
constexpr int min_blocks_forward(int tile) {
  return tile == 64 ? 3 : 4;
}
constexpr int min_blocks_backward(int tile) {
  return tile == 64 ? 2 : 3;
}

__device__ __forceinline__ void fma4(float a, const float4& b, float4& acc) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

__device__ __forceinline__ float4 mul4(const float4& a, float s) {
  return make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
}

// Copies rows [0, rows) of a (rows, hs) head slice of global memory (row stride `stride`
// elements) into the fp32 shared tile dst (kTile, sh.ld). Rows in [rows, kTile) and columns in
// [hs, 4*n4) are written as 0 so they add nothing to dot products and products with P.
template <typename T, int kTile>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const T* __restrict__ src,
                                          std::int64_t stride, int rows, const AttentionShape& sh) {
  constexpr int kThreads = kTile * 4;
  for (int idx = static_cast<int>(threadIdx.x); idx < kTile * sh.n4; idx += kThreads) {
    const int r = idx / sh.n4;
    const int d = 4 * (idx - r * sh.n4);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) {
      const T* p = src + r * stride + d;
      if (sh.vec) {
        const Pack<T, 4> pk = *reinterpret_cast<const Pack<T, 4>*>(p);
        v = make_float4(to_float(pk.v[0]), to_float(pk.v[1]), to_float(pk.v[2]), to_float(pk.v[3]));
      } else {
        v.x = to_float(p[0]);  // d < hs: d is a chunk start below 4 * ceil(hs / 4)
        if (d + 1 < sh.hs) v.y = to_float(p[1]);
        if (d + 2 < sh.hs) v.z = to_float(p[2]);
        if (d + 3 < sh.hs) v.w = to_float(p[3]);
      }
    }
    *reinterpret_cast<float4*>(dst + r * sh.ld + d) = v;
  }
}

// dst[r] = mult * src[r] for r < rows, 0 for r in [rows, kTile): the per-row lse and D values.
template <int kTile>
__device__ __forceinline__ void load_rows(float* __restrict__ dst, const float* __restrict__ src,
                                          int rows, float mult) {
  for (int r = static_cast<int>(threadIdx.x); r < kTile; r += kTile * 4)
    dst[r] = r < rows ? mult * src[r] : 0.0f;
}

// Loads one key tile's K and V slices into sK and sV; `row` points at the q slice of the tile's
// first key in qkv (row stride c3 = 3C) and `rows` (<= kTile) of its rows are before T.
template <typename T, int kTile>
__device__ __forceinline__ void load_kv_tiles(float* sK, float* sV, const T* row, std::int64_t c3,
                                              int rows, const AttentionShape& sh) {
  load_tile<T, kTile>(sK, row + sh.C, c3, rows, sh);
  load_tile<T, kTile>(sV, row + 2 * sh.C, c3, rows, sh);
}

// Loads one query tile's inputs to the backward kernels: Q (`q`: the q slice of the tile's first
// query in qkv, row stride c3 = 3C), dout (`dout_rows`, row stride C), and the rows' lse (times
// log2(e)) and D; `rows` (<= kTile) of the tile's rows are before T.
template <typename T, int kTile>
__device__ __forceinline__ void load_query_tiles(float* sQ, float* sdO, float* sL, float* sD,
                                                 const T* q, const T* dout_rows,
                                                 const float* lse_rows, const float* D_rows,
                                                 std::int64_t c3, int rows,
                                                 const AttentionShape& sh) {
  load_tile<T, kTile>(sQ, q, c3, rows, sh);
  load_tile<T, kTile>(sdO, dout_rows, sh.C, rows, sh);
  load_rows<kTile>(sL, lse_rows, rows, kLog2e);
  load_rows<kTile>(sD, D_rows, rows, 1.0f);
}

// Zeroes a thread's (4 rows, kChunks float4 chunks) output accumulator.
template <int kChunks>
__device__ __forceinline__ void zero_acc(float4 (&acc)[4][kChunks]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int cc = 0; cc < kChunks; ++cc)
      acc[i][cc] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// acc[i][k] += A[i] . B[16 k] over the first 4*n4 columns; A and B point at this thread's first
// row of two (., ld) shared tiles (A: 4 contiguous rows, B: kCols rows 16 apart).
template <int kCols>
__device__ __forceinline__ void dot_tile(float (&acc)[4][kCols], const float* __restrict__ A,
                                         const float* __restrict__ B, int ld, int n4) {
#pragma unroll 1  // 8 float4 loads and 16*kCols FMAs per step; unrolling more spills
  for (int c = 0; c < n4; ++c) {
    float4 a[4], b[kCols];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a[i] = *reinterpret_cast<const float4*>(A + i * ld + 4 * c);
#pragma unroll
    for (int k = 0; k < kCols; ++k)
      b[k] = *reinterpret_cast<const float4*>(B + 16 * k * ld + 4 * c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        float s = acc[i][k];
        s = fmaf(a[i].x, b[k].x, s);
        s = fmaf(a[i].y, b[k].y, s);
        s = fmaf(a[i].z, b[k].z, s);
        s = fmaf(a[i].w, b[k].w, s);
        acc[i][k] = s;
      }
    }
  }
}

// acc[i][cc] (float4) += sum_{j < kTile} W[j][i] * M[j][chunk cc], with W pointing at this
// thread's 4 columns of a (kTile, ldw) shared tile and M at a (kTile, ld) shared tile. The chunk
// of cc is tx + 16 cc clamped to n4 - 1 (clamped accumulators are never stored).
template <int kTile, int kChunks>
__device__ __forceinline__ void acc_tile(float4 (&acc)[4][kChunks], const float* __restrict__ W,
                                         int ldw, const float* __restrict__ M, int ld, int tx,
                                         int n4) {
  int col[kChunks];
#pragma unroll
  for (int cc = 0; cc < kChunks; ++cc)
    col[cc] = 4 * min(tx + 16 * cc, n4 - 1);
#pragma unroll 4
  for (int j = 0; j < kTile; ++j) {
    const float4 w = *reinterpret_cast<const float4*>(W + j * ldw);
#pragma unroll
    for (int cc = 0; cc < kChunks; ++cc) {
      const float4 m = *reinterpret_cast<const float4*>(M + j * ld + col[cc]);
      fma4(w.x, m, acc[0][cc]);
      fma4(w.y, m, acc[1][cc]);
      fma4(w.z, m, acc[2][cc]);
      fma4(w.w, m, acc[3][cc]);
    }
  }
}

__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int off = 1; off < 16; off <<= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int off = 1; off < 16; off <<= 1)
    v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Writes (kAdd: adds to) the n <= 4 values of v at dst, as one aligned access when vec.
template <typename T, bool kAdd>
__device__ __forceinline__ void store4(T* dst, const float4& v, int n, bool vec) {
  if (vec) {  // n == 4: hs % 4 == 0
    Pack<T, 4> pk;
    if constexpr (kAdd) pk = *reinterpret_cast<const Pack<T, 4>*>(dst);
    const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      pk.v[e] = from_float<T>(kAdd ? to_float(pk.v[e]) + f[e] : f[e]);
    *reinterpret_cast<Pack<T, 4>*>(dst) = pk;
  } else {
    const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < n) dst[e] = from_float<T>(kAdd ? to_float(dst[e]) + f[e] : f[e]);
    }
  }
}

// Writes (kAdd: adds) scale * acc to one head row of this thread: chunk cc to columns
// 4 (tx + 16 cc) .. of dst (the row's column 0); chunks at or past hs are skipped.
template <typename T, bool kAdd, int kChunks>
__device__ __forceinline__ void store_row(T* dst, const float4 (&acc)[kChunks], float scale, int tx,
                                          const AttentionShape& sh) {
#pragma unroll
  for (int cc = 0; cc < kChunks; ++cc) {
    const int d = 4 * (tx + 16 * cc);
    if (d < sh.hs) store4<T, kAdd>(dst + d, mul4(acc[cc], scale), min(4, sh.hs - d), sh.vec);
  }
}

// Block -> (b, h, tile): blockIdx.x = rank * (B*NH) + b*NH + h. `reverse` maps rank 0 to the
// last tile, so that the tiles with the longest loops are scheduled first.
struct BlockCoords {
  int b, h, bh, tile;
};
__device__ __forceinline__ BlockCoords block_coords(const AttentionShape& sh, bool reverse) {
  const int bh_count = sh.B * sh.NH;
  const int rank = static_cast<int>(blockIdx.x) / bh_count;
  const int bh = static_cast<int>(blockIdx.x) - rank * bh_count;
  return {bh / sh.NH, bh % sh.NH, bh, reverse ? sh.n_tiles - 1 - rank : rank};
}

}  // namespace attention_detail

// ---- forward ----------------------------------------------------------------------------------
// One block per (b, h, query tile); loops over key tiles 0..tile with an online softmax.
template <typename T, int kTile, int kChunks>
__global__ void __launch_bounds__(kTile * 4, attention_detail::min_blocks_forward(kTile))
    attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse,
                             const T* __restrict__ qkv, const AttentionShape sh) {
  using namespace attention_detail;
  constexpr int kCols = kTile / 16;  // score columns (keys) per thread
  constexpr int kLdp = kTile + 4;
  ZO_DYNAMIC_SHARED(float4, attention_smem);
  float* sQ = reinterpret_cast<float*>(attention_smem);  // (kTile, ld) queries
  float* sK = sQ + kTile * sh.ld;                        // (kTile, ld) keys
  float* sV = sK + kTile * sh.ld;                        // (kTile, ld) values
  float* sPt = sV + kTile * sh.ld;                       // (kTile keys, kLdp) P^T

  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  const BlockCoords bc = block_coords(sh, /*reverse=*/true);
  const int qt = bc.tile, q0 = qt * kTile;
  const std::int64_t c3 = 3LL * sh.C;
  const T* head = qkv + static_cast<std::int64_t>(bc.b) * sh.T * c3 + bc.h * sh.hs;  // q, token 0

  load_tile<T, kTile>(sQ, head + q0 * c3, c3, min(kTile, sh.T - q0), sh);

  float m[4], l[4];  // running max (log2 units) and this thread's partial row sums
  float4 o[4][kChunks];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  zero_acc(o);

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's readers of sK, sV, sPt are done
    load_kv_tiles<T, kTile>(sK, sV, head + k0 * c3, c3, min(kTile, sh.T - k0), sh);
    __syncthreads();

    float s[4][kCols] = {};
    dot_tile<kCols>(s, sQ + 4 * ty * sh.ld, sK + tx * sh.ld, sh.ld, sh.n4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        s[i][k] *= sh.scale_log2;
        if (kt == qt && tx + 16 * k > 4 * ty + i) s[i][k] = -INFINITY;  // key after query
        mx = fmaxf(mx, s[i][k]);
      }
      const float m_new = fmaxf(m[i], half_warp_max(mx));
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no row is ever fully masked
      const float alpha = exp2f(m[i] - m_ref);
      m[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        s[i][k] = exp2f(s[i][k] - m_ref);
        sum += s[i][k];
      }
      l[i] = l[i] * alpha + sum;
#pragma unroll
      for (int cc = 0; cc < kChunks; ++cc)
        o[i][cc] = mul4(o[i][cc], alpha);
    }
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      *reinterpret_cast<float4*>(sPt + (tx + 16 * k) * kLdp + 4 * ty) =
          make_float4(s[0][k], s[1][k], s[2][k], s[3][k]);
    }
    __syncthreads();
    acc_tile<kTile, kChunks>(o, sPt + 4 * ty, kLdp, sV, sh.ld, tx, sh.n4);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float row_sum = half_warp_sum(l[i]);
    const int q = q0 + 4 * ty + i;
    if (q >= sh.T) continue;
    if (tx == 0) lse[static_cast<std::int64_t>(bc.bh) * sh.T + q] = (m[i] + log2f(row_sum)) * kLn2;
    const float inv = 1.0f / row_sum;
    store_row<T, false>(out + (static_cast<std::int64_t>(bc.b) * sh.T + q) * sh.C + bc.h * sh.hs,
                        o[i], inv, tx, sh);
  }
}

// ---- backward ---------------------------------------------------------------------------------
// D (B,NH,T) = rowsum(dout * out) per head: one warp per (b, h, t).
template <typename T>
__global__ void attention_backward_d_kernel(float* __restrict__ D, const T* __restrict__ dout,
                                            const T* __restrict__ out, const AttentionShape sh) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t rows = static_cast<std::int64_t>(sh.B) * sh.NH * sh.T;
  if (row >= rows) return;  // whole warps exit together
  const std::int64_t bh = row / sh.T;
  const int t = static_cast<int>(row - bh * sh.T);
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH);
  const std::int64_t off = (static_cast<std::int64_t>(b) * sh.T + t) * sh.C + h * sh.hs;
  float sum = 0.0f;
  for (int d = lane; d < sh.hs; d += 32)
    sum = fmaf(to_float(dout[off + d]), to_float(out[off + d]), sum);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) D[row] = sum;
}

// dk, dv: one block per (b, h, key tile); loops over query tiles tile..n_tiles-1. The thread
// owns keys 4ty..4ty+3 of the tile and queries tx, tx+16, ... of each query tile.
template <typename T, int kTile, int kChunks>
__global__ void __launch_bounds__(kTile * 4, attention_detail::min_blocks_backward(kTile))
    attention_backward_dkv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                                  const T* __restrict__ qkv, const float* __restrict__ lse,
                                  const float* __restrict__ D, const AttentionShape sh) {
  using namespace attention_detail;
  constexpr int kCols = kTile / 16;
  constexpr int kLdp = kTile + 4;
  ZO_DYNAMIC_SHARED(float4, attention_smem);
  float* sK = reinterpret_cast<float*>(attention_smem);  // (kTile, ld)
  float* sV = sK + kTile * sh.ld;                        // (kTile, ld)
  float* sQ = sV + kTile * sh.ld;                        // (kTile, ld)
  float* sdO = sQ + kTile * sh.ld;                       // (kTile, ld)
  float* sP = sdO + kTile * sh.ld;                       // (kTile queries, kLdp keys)
  float* sdS = sP + kTile * kLdp;                        // (kTile queries, kLdp keys)
  float* sL = sdS + kTile * kLdp;                        // (kTile) lse * log2(e)
  float* sD = sL + kTile;                                // (kTile)

  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  const BlockCoords bc = block_coords(sh, /*reverse=*/false);
  const int kt = bc.tile, k0 = kt * kTile;
  const std::int64_t c3 = 3LL * sh.C;
  const std::int64_t tok0 = static_cast<std::int64_t>(bc.b) * sh.T;  // token index of t = 0
  const T* head = qkv + tok0 * c3 + bc.h * sh.hs;
  const T* dout_head = dout + tok0 * sh.C + bc.h * sh.hs;
  const float* lse_bh = lse + static_cast<std::int64_t>(bc.bh) * sh.T;
  const float* D_bh = D + static_cast<std::int64_t>(bc.bh) * sh.T;

  load_kv_tiles<T, kTile>(sK, sV, head + k0 * c3, c3, min(kTile, sh.T - k0), sh);

  float4 dk[4][kChunks], dv[4][kChunks];
  zero_acc(dk);
  zero_acc(dv);

  for (int qt = kt; qt < sh.n_tiles; ++qt) {
    const int q0 = qt * kTile, rows = min(kTile, sh.T - q0);
    __syncthreads();  // the previous tile's readers of sQ, sdO, sP, sdS, sL, sD are done
    load_query_tiles<T, kTile>(sQ, sdO, sL, sD, head + q0 * c3,
                               dout_head + static_cast<std::int64_t>(q0) * sh.C, lse_bh + q0,
                               D_bh + q0, c3, rows, sh);
    __syncthreads();

    float s[4][kCols] = {}, dp[4][kCols] = {};  // [key i][query k]
    dot_tile<kCols>(s, sK + 4 * ty * sh.ld, sQ + tx * sh.ld, sh.ld, sh.n4);
    dot_tile<kCols>(dp, sV + 4 * ty * sh.ld, sdO + tx * sh.ld, sh.ld, sh.n4);
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      const int qr = tx + 16 * k;  // query row in the tile
      const float row_lse = sL[qr], row_d = sD[qr];
      float p[4], ds[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // Masked: key after query (diagonal tile) or query row past T (last tile).
        const bool live = qr < rows && (qt != kt || 4 * ty + i <= qr);
        p[i] = live ? exp2f(s[i][k] * sh.scale_log2 - row_lse) : 0.0f;
        ds[i] = p[i] * (dp[i][k] - row_d);
      }
      *reinterpret_cast<float4*>(sP + qr * kLdp + 4 * ty) = make_float4(p[0], p[1], p[2], p[3]);
      *reinterpret_cast<float4*>(sdS + qr * kLdp + 4 * ty) =
          make_float4(ds[0], ds[1], ds[2], ds[3]);
    }
    __syncthreads();
    acc_tile<kTile, kChunks>(dv, sP + 4 * ty, kLdp, sdO, sh.ld, tx, sh.n4);
    acc_tile<kTile, kChunks>(dk, sdS + 4 * ty, kLdp, sQ, sh.ld, tx, sh.n4);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = k0 + 4 * ty + i;
    if (key >= sh.T) continue;
    T* dst = dqkv + (tok0 + key) * c3 + bc.h * sh.hs;
    store_row<T, true>(dst + sh.C, dk[i], sh.scale, tx, sh);
    store_row<T, true>(dst + 2 * sh.C, dv[i], 1.0f, tx, sh);
  }
}

// dq: one block per (b, h, query tile); loops over key tiles 0..tile. Same thread layout as the
// forward kernel, with dS^T in place of P^T and K in place of V.
template <typename T, int kTile, int kChunks>
__global__ void __launch_bounds__(kTile * 4, attention_detail::min_blocks_backward(kTile))
    attention_backward_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                                 const T* __restrict__ qkv, const float* __restrict__ lse,
                                 const float* __restrict__ D, const AttentionShape sh) {
  using namespace attention_detail;
  constexpr int kCols = kTile / 16;
  constexpr int kLdp = kTile + 4;
  ZO_DYNAMIC_SHARED(float4, attention_smem);
  float* sQ = reinterpret_cast<float*>(attention_smem);  // (kTile, ld)
  float* sdO = sQ + kTile * sh.ld;                       // (kTile, ld)
  float* sK = sdO + kTile * sh.ld;                       // (kTile, ld)
  float* sV = sK + kTile * sh.ld;                        // (kTile, ld)
  float* sdSt = sV + kTile * sh.ld;                      // (kTile keys, kLdp queries) dS^T
  float* sL = sdSt + kTile * kLdp;                       // (kTile) lse * log2(e)
  float* sD = sL + kTile;                                // (kTile)

  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  const BlockCoords bc = block_coords(sh, /*reverse=*/true);
  const int qt = bc.tile, q0 = qt * kTile, rows = min(kTile, sh.T - q0);
  const std::int64_t c3 = 3LL * sh.C;
  const std::int64_t tok0 = static_cast<std::int64_t>(bc.b) * sh.T;
  const T* head = qkv + tok0 * c3 + bc.h * sh.hs;

  load_query_tiles<T, kTile>(sQ, sdO, sL, sD, head + q0 * c3,
                             dout + (tok0 + q0) * sh.C + bc.h * sh.hs,
                             lse + static_cast<std::int64_t>(bc.bh) * sh.T + q0,
                             D + static_cast<std::int64_t>(bc.bh) * sh.T + q0, c3, rows, sh);

  float4 dq[4][kChunks];
  zero_acc(dq);

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's readers of sK, sV, sdSt are done
    load_kv_tiles<T, kTile>(sK, sV, head + k0 * c3, c3, min(kTile, sh.T - k0), sh);
    __syncthreads();

    float s[4][kCols] = {}, dp[4][kCols] = {};  // [query i][key k]
    dot_tile<kCols>(s, sQ + 4 * ty * sh.ld, sK + tx * sh.ld, sh.ld, sh.n4);
    dot_tile<kCols>(dp, sdO + 4 * ty * sh.ld, sV + tx * sh.ld, sh.ld, sh.n4);
    const float4 row_lse = *reinterpret_cast<const float4*>(sL + 4 * ty);
    const float4 row_d = *reinterpret_cast<const float4*>(sD + 4 * ty);
    const float lse4[4] = {row_lse.x, row_lse.y, row_lse.z, row_lse.w};
    const float d4[4] = {row_d.x, row_d.y, row_d.z, row_d.w};
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
      float ds[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        // Rows past T are never stored, so only the causal mask matters here.
        const bool live = kt != qt || tx + 16 * k <= 4 * ty + i;
        const float p = live ? exp2f(s[i][k] * sh.scale_log2 - lse4[i]) : 0.0f;
        ds[i] = p * (dp[i][k] - d4[i]);
      }
      *reinterpret_cast<float4*>(sdSt + (tx + 16 * k) * kLdp + 4 * ty) =
          make_float4(ds[0], ds[1], ds[2], ds[3]);
    }
    __syncthreads();
    acc_tile<kTile, kChunks>(dq, sdSt + 4 * ty, kLdp, sK, sh.ld, tx, sh.n4);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int q = q0 + 4 * ty + i;
    if (q >= sh.T) continue;
    store_row<T, true>(dqkv + (tok0 + q) * c3 + bc.h * sh.hs, dq[i], sh.scale, tx, sh);
  }
}

}  // namespace zo::gpu
