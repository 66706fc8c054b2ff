// Causal multi-head self-attention, private to gpu/src: what the forward (attention_forward.cu)
// and backward (attention_backward.cu) kernels and launchers share (launchers declared in
// gpu/ops.h). FlashAttention-2 style (Dao, arXiv 2307.08691): the (B,NH,T,T) score matrix is never
// stored; keys are visited in tiles with an online softmax, and only the per-row log-sum-exp is
// kept for the backward pass, which recomputes the probabilities from it.
//
// Definitions (those of the fp32 host reference, src/device/host_ops_attention.cpp):
//   qkv (B, T, (NH + 2 NKV) hs) = [q (NH heads) | k (NKV heads) | v (NKV heads)] per token, head h
//   of a part at its columns [h*hs, (h+1)*hs); query head h attends with kv head h / (NH / NKV)
//   (grouped-query attention; NKV = NH is multi-head). out, dout (B, T, NH hs).
//   s_ij = (q_i . k_j) / sqrt(hs) for j <= i (causal), P = softmax_j(s), out_i = sum_j P_ij v_j.
//   lse_i = log(sum_{j<=i} exp(s_ij)) (natural log, of the scaled scores), (B,NH,T) fp32.
//   Backward (Algorithm 2): D_i = dout_i . out_i, dP = dout V^T, dS = P o (dP - D),
//   dq = scale dS K, dk = scale dS^T Q, dv = P^T dout, all written into dqkv; dk and dv of a kv
//   head sum over its NH / NKV query heads.
// Storage type T is float, __half or __nv_bfloat16; every product and sum is fp32. Exponentials
// use exp2f on scores pre-multiplied by log2(e)/sqrt(hs); lse is converted back to natural log.
//
// Two implementations: bf16/fp16 heads of 64 and 128 (GPT-2's) run on tensor cores
// (attention_tc.cuh: mma.sync, ldmatrix, cp.async, its own tiling and predicted speed); fp32 and
// every other head size run on the fp32 FMA kernels described below. The launchers choose.
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
//   - Grid: 1-D, B*NH*ceil(T/kTile) blocks (B*NKV*... for dk/dv, whose block loops over the query
//     tiles of each query head of its group in turn), ordered so that the blocks with the most
//     tiles to visit (late query tiles forward and for dq, early key tiles for dk/dv) start first.
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
// each) so each dqkv element is written exactly once, by one thread: no atomics, no zero-filled
// buffer, deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "cast.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

// Problem shape and derived tiling constants, computed once on the host.
struct AttentionShape {
  int B, T, NH, NKV, hs;
  int C;             // NH * hs: the q part's width, out's row length
  int group;         // NH / NKV: query heads per kv head
  int ld_qkv;        // (NH + 2 NKV) hs: qkv's row length
  int n4;            // ceil(hs / 4): float4 chunks per head row
  int ld;            // shared-memory row stride (floats) of head-dimension tiles; ld / 4 odd
  int n_tiles;       // ceil(T / kTile)
  float scale;       // 1 / sqrt(hs)
  float scale_log2;  // log2(e) / sqrt(hs)
  bool vec;          // 4-element global accesses are aligned (hs % 4 == 0, aligned pointers)
  bool async16;      // 16-byte chunks of head rows are aligned (attention_tc.cuh: cp.async)
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

// Columns of kv head g's k and v slices in a qkv row.
__host__ __device__ __forceinline__ int k_col(const AttentionShape& sh, int g) {
  return sh.C + g * sh.hs;
}
__host__ __device__ __forceinline__ int v_col(const AttentionShape& sh, int g) {
  return sh.C + (sh.NKV + g) * sh.hs;
}

// Loads one key tile's K and V slices of kv head g into sK and sV; `row` points at the tile's
// first key's row of qkv (column 0, row stride sh.ld_qkv) and `rows` (<= kTile) of its rows are
// before T.
template <typename T, int kTile>
__device__ __forceinline__ void load_kv_tiles(float* sK, float* sV, const T* row, int g, int rows,
                                              const AttentionShape& sh) {
  load_tile<T, kTile>(sK, row + k_col(sh, g), sh.ld_qkv, rows, sh);
  load_tile<T, kTile>(sV, row + v_col(sh, g), sh.ld_qkv, rows, sh);
}

// Loads one query tile's inputs to the backward kernels: Q (`q`: the q slice of the tile's first
// query in qkv, row stride c3 = sh.ld_qkv), dout (`dout_rows`, row stride C), and the rows' lse
// (times log2(e)) and D; `rows` (<= kTile) of the tile's rows are before T.
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

// Block -> (b, h, tile): blockIdx.x = rank * (B*heads) + b*heads + h, h a query head (heads =
// NH) or a kv head (heads = NKV: the dk/dv kernels). `reverse` maps rank 0 to the last tile, so
// that the tiles with the longest loops are scheduled first.
struct BlockCoords {
  int b, h, bh, tile;
};
__device__ __forceinline__ BlockCoords block_coords(const AttentionShape& sh, bool reverse,
                                                    int heads) {
  const int bh_count = sh.B * heads;
  const int rank = static_cast<int>(blockIdx.x) / bh_count;
  const int bh = static_cast<int>(blockIdx.x) - rank * bh_count;
  return {bh / heads, bh % heads, bh, reverse ? sh.n_tiles - 1 - rank : rank};
}

// ---- host side: shape checks and launch helpers ----------------------------------------------

constexpr int kMaxHeadSize = 128;
constexpr int kDefaultSmem = 48 * 1024;

// Tile rows per block for a head size: 64 up to hs = 64, 32 above (bounds shared memory).
inline int tile_for(int hs) {
  return hs <= 64 ? 64 : 32;
}

// Checks the shape, the pointers and the dtype; returns the shape with its tiling constants.
// `ptrs` are the storage-type tensors, whose alignment decides the vector path.
inline AttentionShape make_shape(const char* op, const AttentionDims& d, DType t,
                                 std::initializer_list<detail::Named> ptrs) {
  const std::pair<int, const char*> dims[] = {
      {d.B, "B"}, {d.T, "T"}, {d.NH, "NH"}, {d.NKV, "NKV"}, {d.hs, "hs"}};
  for (const auto& [v, name] : dims) {
    if (v <= 0) detail::bad_arg(op, std::string(name) + " = " + std::to_string(v) + " must be > 0");
  }
  if (d.NH % d.NKV != 0) {
    detail::bad_arg(op, "NH = " + std::to_string(d.NH) + " is not a multiple of NKV = " +
                            std::to_string(d.NKV) + "; each kv head serves a whole group of heads");
  }
  const int hs = d.hs;
  if (hs > kMaxHeadSize) {
    detail::bad_arg(op, "head size " + std::to_string(hs) +
                            " is not supported; supported head sizes are 1.." +
                            std::to_string(kMaxHeadSize) + " (GPT-2 uses 64, Llama 64 and 128)");
  }
  detail::check_not_null(op, ptrs);
  detail::check_dtype(op, t);
  const int tile = tile_for(hs);
  const std::int64_t n_tiles = (std::int64_t{d.T} + tile - 1) / tile;
  const std::int64_t ld_qkv = (std::int64_t{d.NH} + 2 * std::int64_t{d.NKV}) * hs;
  if (std::int64_t{d.B} * d.NH * n_tiles > std::numeric_limits<int>::max() ||
      std::int64_t{d.B} * d.NH * d.T > std::int64_t{std::numeric_limits<int>::max()} * 8 ||
      ld_qkv > std::numeric_limits<int>::max()) {
    detail::bad_arg(op, "B * NH * T = " + std::to_string(std::int64_t{d.B} * d.NH * d.T) +
                            " or the qkv row is too large for one launch");
  }

  AttentionShape sh{};
  sh.B = d.B;
  sh.T = d.T;
  sh.NH = d.NH;
  sh.NKV = d.NKV;
  sh.hs = hs;
  sh.C = d.NH * hs;
  sh.group = d.NH / d.NKV;
  sh.ld_qkv = static_cast<int>(ld_qkv);
  sh.n4 = (hs + 3) / 4;
  sh.ld = 4 * (sh.n4 | 1);
  sh.n_tiles = static_cast<int>(n_tiles);
  sh.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  sh.scale_log2 = sh.scale * 1.4426950408889634f;
  const std::size_t vec_bytes = 4 * dtype_size(t);
  sh.vec = hs % 4 == 0;
  sh.async16 = (hs * dtype_size(t)) % 16 == 0;
  for (const detail::Named& p : ptrs) {
    sh.vec = sh.vec && detail::aligned(p.p, vec_bytes);
    sh.async16 = sh.async16 && detail::aligned(p.p, 16);
  }
  return sh;
}

// Opts `kernel` into `bytes` of dynamic shared memory when that exceeds the 48 KiB default.
template <typename Kernel>
void set_smem(const char* op, Kernel* kernel, std::size_t bytes) {
  if (bytes <= kDefaultSmem) return;
  const int device = detail::current_device();
  const int optin = detail::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (bytes > static_cast<std::size_t>(optin)) {
    detail::bad_arg(op, "needs " + std::to_string(bytes) +
                            " bytes of shared memory per block; device " + std::to_string(device) +
                            " allows " + std::to_string(optin));
  }
  detail::opt_in_shared_memory(device, reinterpret_cast<const void*>(kernel), bytes);
}

// Shared-memory bytes: `tiles` (kTile, ld) head tiles, `ptiles` (kTile, kTile + 4) score tiles and
// `rows` per-row vectors of kTile floats.
inline std::size_t smem_bytes(const AttentionShape& sh, int tile, int tiles, int ptiles, int rows) {
  return sizeof(float) * static_cast<std::size_t>(tile) *
         (static_cast<std::size_t>(tiles) * sh.ld + static_cast<std::size_t>(ptiles) * (tile + 4) +
          rows);
}

// Launches `kernel` on one block of `threads` per (b, head of `heads`, tile of sh.n_tiles), with
// `smem` bytes of dynamic shared memory (opted into when above the default).
template <typename Kernel, typename... Args>
void launch_tiles(const char* op, Kernel* kernel, std::size_t smem, int threads, int heads,
                  const AttentionShape& sh, cudaStream_t s, Args... args) {
  set_smem(op, kernel, smem);
  const std::size_t blocks = static_cast<std::size_t>(sh.B) * heads * sh.n_tiles;
  ZO_LAUNCH(static_cast<unsigned>(blocks), threads, smem, s, kernel)(args..., sh);
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace attention_detail
}  // namespace zo::gpu
