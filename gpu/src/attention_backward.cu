// Causal attention backward (launch_attention_backward): D = rowsum(dout * out), then dk/dv per key
// tile and dq per query tile, scores recomputed from lse. Algorithm, tiling and memory:
// attention.cuh.
#include <cstdint>

#include "attention.cuh"
#include "attention_tc.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

// ---- backward ---------------------------------------------------------------------------------
// The first element of (b, h, t) row `row` of the (B, NH, T) D in dout and out (B, T, C).
__device__ __forceinline__ std::int64_t head_row_offset(std::int64_t row,
                                                        const AttentionShape& sh) {
  const std::int64_t bh = row / sh.T;
  const int t = static_cast<int>(row - bh * sh.T);
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH);
  return (static_cast<std::int64_t>(b) * sh.T + t) * sh.C + h * sh.hs;
}

// D (B,NH,T) = rowsum(dout * out) per head: one warp per (b, h, t).
template <typename T>
__global__ void attention_backward_d_kernel(float* __restrict__ D, const T* __restrict__ dout,
                                            const T* __restrict__ out, const AttentionShape sh) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t rows = static_cast<std::int64_t>(sh.B) * sh.NH * sh.T;
  if (row >= rows) return;  // whole warps exit together
  const std::int64_t off = head_row_offset(row, sh);
  float sum = 0.0f;
  for (int d = lane; d < sh.hs; d += 32)
    sum = fmaf(to_float(dout[off + d]), to_float(out[off + d]), sum);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) D[row] = sum;
}

// The same D in 16-byte packs, when every head row starts 16-byte aligned (sh.async16): kGroup
// lanes per row, lane k summing packs k, k + kGroup, ..., then a butterfly within its group.
// (A warp per row with 2-byte loads moved 0.66 TB/s on an H100, 0.9 ms of the 124M step.)
template <typename T>
__global__ void attention_backward_d_packed_kernel(float* __restrict__ D,
                                                   const T* __restrict__ dout,
                                                   const T* __restrict__ out,
                                                   const AttentionShape sh) {
  constexpr int kVec = 16 / sizeof(T), kGroup = 8;
  const std::int64_t row =
      (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kGroup;
  const int sub = static_cast<int>(threadIdx.x) % kGroup;
  const bool live = row < static_cast<std::int64_t>(sh.B) * sh.NH * sh.T;
  float sum = 0.0f;
  if (live) {
    const std::int64_t off = head_row_offset(row, sh);
    for (int p = sub * kVec; p < sh.hs; p += kGroup * kVec) {
      float a[kVec], o[kVec];
      load_floats<T, kVec>(dout + off + p, a);
      load_floats<T, kVec>(out + off + p, o);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        sum = fmaf(a[k], o[k], sum);
    }
  }
#pragma unroll
  for (int o = kGroup / 2; o > 0; o >>= 1)  // every lane of the warp takes part
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (live && sub == 0) D[row] = sum;
}

// dk, dv: one block per (b, kv head g, key tile); loops over the query heads of g's group and for
// each over query tiles tile..n_tiles-1. The thread owns keys 4ty..4ty+3 of the tile and queries
// tx, tx+16, ... of each query tile.
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
  const BlockCoords bc = block_coords(sh, /*reverse=*/false, sh.NKV);
  const int kt = bc.tile, k0 = kt * kTile, g = bc.h;
  const std::int64_t c3 = sh.ld_qkv;
  const std::int64_t tok0 = static_cast<std::int64_t>(bc.b) * sh.T;  // token index of t = 0
  const T* seq = qkv + tok0 * c3;

  load_kv_tiles<T, kTile>(sK, sV, seq + k0 * c3, g, min(kTile, sh.T - k0), sh);

  float4 dk[4][kChunks], dv[4][kChunks];
  zero_acc(dk);
  zero_acc(dv);

  const int q_tiles = sh.n_tiles - kt;  // per query head
  for (int step = 0; step < sh.group * q_tiles; ++step) {
    const int h = g * sh.group + step / q_tiles, qt = kt + step % q_tiles;
    const std::int64_t bh = static_cast<std::int64_t>(bc.b) * sh.NH + h;
    const int q0 = qt * kTile, rows = min(kTile, sh.T - q0);
    __syncthreads();  // the previous tile's readers of sQ, sdO, sP, sdS, sL, sD are done
    load_query_tiles<T, kTile>(sQ, sdO, sL, sD, seq + q0 * c3 + h * sh.hs,
                               dout + (tok0 + q0) * sh.C + h * sh.hs, lse + bh * sh.T + q0,
                               D + bh * sh.T + q0, c3, rows, sh);
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
    T* dst = dqkv + (tok0 + key) * c3;
    store_row<T, false>(dst + k_col(sh, g), dk[i], sh.scale, tx, sh);
    store_row<T, false>(dst + v_col(sh, g), dv[i], 1.0f, tx, sh);
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
  const BlockCoords bc = block_coords(sh, /*reverse=*/true, sh.NH);
  const int qt = bc.tile, q0 = qt * kTile, rows = min(kTile, sh.T - q0), kv = bc.h / sh.group;
  const std::int64_t c3 = sh.ld_qkv;
  const std::int64_t tok0 = static_cast<std::int64_t>(bc.b) * sh.T;
  const T* seq = qkv + tok0 * c3;

  load_query_tiles<T, kTile>(sQ, sdO, sL, sD, seq + q0 * c3 + bc.h * sh.hs,
                             dout + (tok0 + q0) * sh.C + bc.h * sh.hs,
                             lse + static_cast<std::int64_t>(bc.bh) * sh.T + q0,
                             D + static_cast<std::int64_t>(bc.bh) * sh.T + q0, c3, rows, sh);

  float4 dq[4][kChunks];
  zero_acc(dq);

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's readers of sK, sV, sdSt are done
    load_kv_tiles<T, kTile>(sK, sV, seq + k0 * c3, kv, min(kTile, sh.T - k0), sh);
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
    store_row<T, false>(dqkv + (tok0 + q) * c3 + bc.h * sh.hs, dq[i], sh.scale, tx, sh);
  }
}

using namespace attention_detail;  // NOLINT(google-build-using-namespace): this op's own helpers

namespace {

template <typename T, int kTile, int kChunks>
void backward_typed(void* dqkv, const void* dout, const void* qkv, const void* out,
                    const float* lse, float* scratch, const AttentionShape& sh, DType t,
                    cudaStream_t s) {
  constexpr const char* op = "launch_attention_backward";
  const auto* dout_t = static_cast<const T*>(dout);
  const auto* qkv_t = static_cast<const T*>(qkv);
  auto* dqkv_t = static_cast<T*>(dqkv);

  constexpr int kDThreads = 256;
  const std::int64_t rows = std::int64_t{sh.B} * sh.NH * sh.T;
  if (sh.async16) {  // 8 lanes per (b, h, t) row
    const auto d_blocks =
        static_cast<unsigned>(detail::ceil_div(rows, std::int64_t{kDThreads / 8}));
    ZO_LAUNCH(d_blocks, kDThreads, 0, s, attention_backward_d_packed_kernel<T>)
    (scratch, dout_t, static_cast<const T*>(out), sh);
  } else {  // one warp per row
    const auto d_blocks =
        static_cast<unsigned>(detail::ceil_div(rows, std::int64_t{kDThreads / 32}));
    ZO_LAUNCH(d_blocks, kDThreads, 0, s, attention_backward_d_kernel<T>)
    (scratch, dout_t, static_cast<const T*>(out), sh);
  }
  ZO_CUDA_CHECK_LAUNCH();

  if (attention_tc::eligible(sh.hs, t)) {
    attention_tc::backward(dqkv, dout, qkv, lse, scratch, sh, t, s);
    return;
  }
  // dk/dv and dq write disjoint parts of dqkv, so their order does not matter.
  launch_tiles(op, &attention_backward_dkv_kernel<T, kTile, kChunks>,
               smem_bytes(sh, kTile, 4, 2, 2), kTile * 4, sh.NKV, sh, s, dqkv_t, dout_t, qkv_t, lse,
               scratch);
  launch_tiles(op, &attention_backward_dq_kernel<T, kTile, kChunks>, smem_bytes(sh, kTile, 4, 1, 2),
               kTile * 4, sh.NH, sh, s, dqkv_t, dout_t, qkv_t, lse, scratch);
}

}  // namespace

std::size_t attention_backward_scratch_floats(const AttentionDims& d) {
  const AttentionShape sh = make_shape("launch_attention_backward", d, DType::kF32, {});
  return static_cast<std::size_t>(sh.B) * static_cast<std::size_t>(sh.NH) *
         static_cast<std::size_t>(sh.T);
}

void launch_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, float* scratch, const AttentionDims& d, DType t,
                               cudaStream_t s) {
  const AttentionShape sh =
      make_shape("launch_attention_backward", d, t,
                 {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}});
  detail::check_not_null("launch_attention_backward", {{lse, "lse"}, {scratch, "scratch"}});
  ZO_DISPATCH_DTYPE(t, T_, {
    if (tile_for(sh.hs) == 64) {
      backward_typed<T_, 64, 1>(dqkv, dout, qkv, out, lse, scratch, sh, t, s);
    } else {
      backward_typed<T_, 32, 2>(dqkv, dout, qkv, out, lse, scratch, sh, t, s);
    }
  });
}

}  // namespace zo::gpu
