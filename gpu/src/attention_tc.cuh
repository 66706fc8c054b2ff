// Causal attention on tensor cores for bf16/fp16 storage and head sizes 64 and 128, private to
// gpu/src: what the tensor-core forward (attention_tc_forward.cu) and backward
// (attention_tc_backward.cu) kernels share. The launchers (attention_forward.cu,
// attention_backward.cu) send fp32 and other head sizes to the FMA kernels of attention.cuh, whose
// definitions (s, P, lse, D, dS) and FlashAttention-2 algorithm these kernels follow.
//
// Instructions (mma.cuh): mma.sync m16n8k16 with T inputs and fp32 accumulators, ldmatrix.x4
// (.trans for operands stored k-major) from shared memory, cp.async.cg 16-byte copies of every
// head tile and cp.async.ca 4-byte copies of lse and D, double-buffered. Operands that are not
// 16-byte aligned take a synchronous element-by-element load into the same tiles instead.
//
// Blocks: 128 threads (4 warps) and 64 rows of the block's own axis (queries, or keys for dK/dV);
// warp w owns rows 16w..16w+15 of it, so softmax rows never leave a warp: each row's 8-column
// accumulator tiles are spread over the 4 lanes of a quad (reductions: 2 xor-shuffles). Tiles of
// the other axis (the loop) are kN rows. Score tiles are produced in mma accumulators and fed back
// as the A operand of the next product straight from registers (the C and A fragment layouts of
// m16n8k16 line up), so P and dS never touch shared memory.
//   forward   per 64 queries, loops key tiles (kN = 64) up to the diagonal:
//             S = Q K^T (Q and K through ldmatrix), online softmax in registers, O += P V (V
//             .trans)
//   bwd dK/dV per 64 keys, loops query tiles (kN = 64 for hs 64, 32 for hs 128) from the diagonal:
//             S^T = K Q^T, dP^T = V dO^T, P^T from lse, dS^T = P^T o (dP^T - D),
//             dV += P^T dO, dK += dS^T Q (dO, Q .trans)
//   bwd dQ    per 64 queries, loops key tiles (kN = 64 / 32) up to the diagonal:
//             S = Q K^T, dP = dO V^T, dS, dQ += dS K (K .trans)
// Deterministic: every dqkv element is written once, by one thread of one block (dQ in its own
// kernel, recomputing S and dP), no atomics.
//
// Shared memory (T elements, rows of hs + 8 so that the 8 rows of an ldmatrix phase fall in 8
// different 16-byte bank groups; x2: double buffers), registers (ptxas, nvcc 13.0, sm_80 / sm_90,
// no spills) and the blocks per H100 SM they allow, hs 64 / hs 128:
//   forward  Q 64 + (K, V) 64 x2 rows                  45 KiB,  99 regs, 4 / 85 KiB, 133 regs, 2
//   dK/dV    K, V 64 + (Q, dO) kN x2 + (lse, D) kN x2  55 KiB, 186 regs, 2 / 68.5 KiB, 238, 2
//   dQ       Q, dO 64 + (K, V) kN x2                   54 KiB, 130 regs, 3 / 68 KiB, 132 regs, 3
// Above 48 KiB the launchers opt in (attention.cuh, set_smem).
//
// Predicted on an H100 SXM (a prediction from FLOP counts and published FlashAttention-2 rates:
// nothing here was measured). GPT-2 124M, B = 16, T = 1024, NH = 12, hs = 64: one T x T x hs
// product over all heads is 25.8 GFLOP dense, 13.7 GFLOP over the 136 of 256 tile pairs at or
// below the diagonal. Per layer the forward runs 2 products (27.4 GFLOP), the backward 7 (4 in
// dK/dV, 3 in dQ: 95.8 GFLOP, of which 2 recompute S and dP). The dense bf16 peak is 989
// TFLOP/s, whose last part needs wgmma rather than mma.sync; FlashAttention-2 (mma.sync) is
// reported at about 35% of it. These simpler kernels (64-row blocks of 4 warps, Q re-read through
// ldmatrix for every tile, no warp specialisation) should run at 15-25% of peak forward and
// 10-18% backward: 0.11-0.18 ms forward and 0.55-1.0 ms backward per layer. The fp32 FMA kernels
// took about 1.2 ms and 4.2 ms per layer on the H100 run of docs/performance.md (28.3 ms of
// forward over a step and an evaluation forward, 50.2 ms of backward, 12 layers).
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention.cuh"
#include "cast.cuh"
#include "mma.cuh"

namespace zo::gpu::attention_tc {

constexpr int kThreads = 128;  // 4 warps of 16 rows
constexpr int kRows = 64;      // rows of the block's own axis

// The tensor-core kernels take bf16/fp16 heads of 64 or 128.
inline bool eligible(int hs, DType t) {
  return (hs == 64 || hs == 128) && (t == DType::kBF16 || t == DType::kF16);
}

// Loop-axis tile rows: 64 for hs 64, 32 for hs 128 (bounds the score accumulators).
template <int kD>
__host__ __device__ constexpr int loop_rows() {
  return kD == 64 ? 64 : 32;
}

// Row stride (elements) of a shared tile.
template <int kD>
__host__ __device__ constexpr int ld() {
  return kD + 8;
}

// This lane's row address for an ldmatrix.x4 of the 16x16 block at (r0, c0) of a tile, matrices
// in A-fragment order ((rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)); with .trans
// the same order gives the B fragments of columns c0..c0+7 (registers 0, 1) and c0+8.. (2, 3).
template <int kD, typename T>
__device__ __forceinline__ const T* frag_a(const T* tile, int r0, int c0, int lane) {
  return tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld<kD>() + c0 + (lane >> 4) * 8;
}

// ... for B fragments without .trans from a tile stored n-major: rows r0..r0+7 (registers 0, 1)
// and r0+8.. (2, 3) as two 8-column tiles of B, columns c0..c0+15 as k.
template <int kD, typename T>
__device__ __forceinline__ const T* frag_b(const T* tile, int r0, int c0, int lane) {
  return tile + (r0 + (lane & 7) + (lane >> 4) * 8) * ld<kD>() + c0 + ((lane >> 3) & 1) * 8;
}

// acc[2 nn] and acc[2 nn + 1] += a times the B fragments of two 8-column tiles in b (registers
// 0, 1 and 2, 3, as ldmatrix_x4 through frag_a with .trans or frag_b gives them).
template <typename T, int kTiles>
__device__ __forceinline__ void mma_pair(float (&acc)[kTiles][4], int nn,
                                         const std::uint32_t (&a)[4], const std::uint32_t (&b)[4]) {
  mma::mma_m16n8k16<T>(acc[2 * nn], a, b[0], b[1]);
  mma::mma_m16n8k16<T>(acc[2 * nn + 1], a, b[2], b[3]);
}

// acc (16 x kN: kN / 8 tiles of 16 x 8) += A B^T, A = rows a0..a0+15 of tile `a`, B = rows
// 0..kN-1 of tile `b`, both (., kD) in shared memory: S = Q K^T and its kin.
template <typename T, int kD, int kN>
__device__ __forceinline__ void mma_abt(float (&acc)[kN / 8][4], const T* a, int a0, const T* b,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    std::uint32_t af[4];
    mma::ldmatrix_x4(af, frag_a<kD>(a, a0, 16 * kk, lane));
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      std::uint32_t bf[4];
      mma::ldmatrix_x4(bf, frag_b<kD>(b, 16 * nn, 16 * kk, lane));
      mma_pair<T>(acc, nn, af, bf);
    }
  }
}

// acc (16 x kD) += P M, P (16 x kK) in accumulator registers (rounded to T), M = rows 0..kK-1 of
// the (kK, kD) shared tile `m`: O += P V and its kin.
template <typename T, int kD, int kK>
__device__ __forceinline__ void mma_pm(float (&acc)[kD / 8][4], const float (&p)[kK / 8][4],
                                       const T* m, int lane) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const std::uint32_t pa[4] = {mma::pack2<T>(p[2 * kk][0], p[2 * kk][1]),
                                 mma::pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                                 mma::pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                 mma::pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int nn = 0; nn < kD / 16; ++nn) {
      std::uint32_t bf[4];
      mma::ldmatrix_x4<true>(bf, frag_a<kD>(m, 16 * kk, 16 * nn, lane));
      mma_pair<T>(acc, nn, pa, bf);
    }
  }
}

// Rows [0, rows) (rows >= 1) of a (kR, kD) head slice at src, row stride `stride` elements, into
// the (kR, ld) shared tile dst; rows [rows, kR) are zero (cp.async reads nothing for them).
template <typename T, int kR, int kD>
__device__ __forceinline__ void load_tile(T* dst, const T* src, std::int64_t stride, int rows,
                                          bool async) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = static_cast<int>(threadIdx.x); c < kR * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c - r * kChunks) * 8;
    T* d = dst + r * ld<kD>() + col;
    const T* s = src + static_cast<std::int64_t>(min(r, rows - 1)) * stride + col;
    if (async) {
      mma::cp_async_cg16(d, s, r < rows ? 16 : 0);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        d[e] = r < rows ? s[e] : from_float<T>(0.0f);
    }
  }
}

// src[0, rows) into dst[0, kR), zeros past rows: per-row lse or D.
template <int kR>
__device__ __forceinline__ void load_rows(float* dst, const float* src, int rows) {
  for (int r = static_cast<int>(threadIdx.x); r < kR; r += kThreads)
    mma::cp_async_ca<4>(dst + r, src + min(r, rows - 1), r < rows ? 4 : 0);
}

// K and V of kv head g's loop tile kt (kN keys from token kt kN) into buffer `buf` of sK and
// sV; `seq` is token 0's row of the block's sequence in qkv (row stride c3 = sh.ld_qkv).
template <typename T, int kN, int kD>
__device__ __forceinline__ void load_kv(T* sK, T* sV, const T* seq, std::int64_t c3, int g, int kt,
                                        int buf, const AttentionShape& sh) {
  const T* row = seq + static_cast<std::int64_t>(kt) * kN * c3;
  const int rows = min(kN, sh.T - kt * kN);
  load_tile<T, kN, kD>(sK + buf * kN * ld<kD>(), row + attention_detail::k_col(sh, g), c3, rows,
                       sh.async16);
  load_tile<T, kN, kD>(sV + buf * kN * ld<kD>(), row + attention_detail::v_col(sh, g), c3, rows,
                       sh.async16);
}

// A thread's place: lane, warp, the block's (b, h, tile) with h a query head (kv_blocks: a kv
// head), the row stride c3 of qkv (B, T, (NH + 2 NKV) hs) and the element offsets of token 0 of
// its sequence in qkv and of its head in out-shaped (B, T, C = NH hs) tensors.
struct Frame {
  int lane, warp;
  attention_detail::BlockCoords bc;
  std::int64_t c3, seq0, out0;

  __device__ Frame(const AttentionShape& sh, bool reverse, bool kv_blocks = false)
      : lane(static_cast<int>(threadIdx.x) % 32),
        warp(static_cast<int>(threadIdx.x) / 32),
        bc(attention_detail::block_coords(sh, reverse, kv_blocks ? sh.NKV : sh.NH)),
        c3(sh.ld_qkv),
        seq0(static_cast<std::int64_t>(bc.b) * sh.T * c3),
        out0(static_cast<std::int64_t>(bc.b) * sh.T * sh.C + bc.h * sh.hs) {}
};

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Writes (kAdd: adds) scale[h] * acc to this lane's rows row0 + 8 h (h = 0, 1) of dst (row
// stride `stride`), rows at or past `limit` skipped; element (row, col) of tile j is acc[j][2 h +
// e] at col = 8 j + 2 (lane % 4) + e.
template <typename T, bool kAdd, int kD>
__device__ __forceinline__ void store_rows(T* dst, std::int64_t stride,
                                           const float (&acc)[kD / 8][4], const float (&scale)[2],
                                           int row0, int limit, bool vec, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row >= limit) continue;
    T* dst_row = dst + row * stride + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      T* p = dst_row + 8 * j;
      float v0 = scale[h] * acc[j][2 * h], v1 = scale[h] * acc[j][2 * h + 1];
      if (vec) {
        Pack<T, 2> pk;
        if constexpr (kAdd) {
          pk = *reinterpret_cast<const Pack<T, 2>*>(p);
          v0 += to_float(pk.v[0]);
          v1 += to_float(pk.v[1]);
        }
        pk.v[0] = from_float<T>(v0);
        pk.v[1] = from_float<T>(v1);
        *reinterpret_cast<Pack<T, 2>*>(p) = pk;
      } else {
        if constexpr (kAdd) {
          v0 += to_float(p[0]);
          v1 += to_float(p[1]);
        }
        p[0] = from_float<T>(v0);
        p[1] = from_float<T>(v1);
      }
    }
  }
}

// ---- host side: entry points of the launchers (attention_forward.cu, attention_backward.cu) ----

// sh: make_shape's; t: bf16 or fp16; eligible(sh.hs, t).
void forward(void* out, float* lse, const void* qkv, const AttentionShape& sh, DType t,
             cudaStream_t s);
// D: rowsum(dout * out) (B, NH, T), already computed.
void backward(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* D,
              const AttentionShape& sh, DType t, cudaStream_t s);

// The shape with n_tiles counting 64-row block tiles.
inline AttentionShape block_shape(const AttentionShape& sh) {
  AttentionShape r = sh;
  r.n_tiles = static_cast<int>(detail::ceil_div(sh.T, kRows));
  return r;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// f(TypeTag<T>, std::integral_constant<int, hs>) for t in {bf16, fp16}, hs in {64, 128}.
template <typename F>
void dispatch(DType t, int hs, F&& f) {
  auto by_size = [&](auto tag) {
    if (hs == 64) {
      f(tag, std::integral_constant<int, 64>{});
    } else {
      f(tag, std::integral_constant<int, 128>{});
    }
  };
  if (t == DType::kBF16) {
    by_size(TypeTag<__nv_bfloat16>{});
  } else {
    by_size(TypeTag<__half>{});
  }
}

}  // namespace zo::gpu::attention_tc
