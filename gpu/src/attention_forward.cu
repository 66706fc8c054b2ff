// Causal attention forward (launch_attention_forward): one block per (b, h, query tile), an online
// softmax over the key tiles up to the diagonal. Algorithm, tiling and memory: attention.cuh.
#include <cstdint>

#include "attention.cuh"
#include "attention_tc.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

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
  const BlockCoords bc = block_coords(sh, /*reverse=*/true, sh.NH);
  const int qt = bc.tile, q0 = qt * kTile, kv = bc.h / sh.group;
  const std::int64_t c3 = sh.ld_qkv;
  const T* seq = qkv + static_cast<std::int64_t>(bc.b) * sh.T * c3;  // token 0's row

  load_tile<T, kTile>(sQ, seq + q0 * c3 + bc.h * sh.hs, c3, min(kTile, sh.T - q0), sh);

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
    load_kv_tiles<T, kTile>(sK, sV, seq + k0 * c3, kv, min(kTile, sh.T - k0), sh);
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

using namespace attention_detail;  // NOLINT(google-build-using-namespace): this op's own helpers

namespace {

template <typename T, int kTile, int kChunks>
void forward_typed(void* out, float* lse, const void* qkv, const AttentionShape& sh,
                   cudaStream_t s) {
  launch_tiles("launch_attention_forward", &attention_forward_kernel<T, kTile, kChunks>,
               smem_bytes(sh, kTile, 3, 1, 0), kTile * 4, sh.NH, sh, s, static_cast<T*>(out), lse,
               static_cast<const T*>(qkv));
}

}  // namespace

void launch_attention_forward(void* out, float* lse, const void* qkv, const AttentionDims& d,
                              DType t, cudaStream_t s) {
  const AttentionShape sh =
      make_shape("launch_attention_forward", d, t, {{out, "out"}, {qkv, "qkv"}});
  detail::check_not_null("launch_attention_forward", {{lse, "lse"}});
  if (attention_tc::eligible(sh.hs, t)) {
    attention_tc::forward(out, lse, qkv, sh, t, s);
    return;
  }
  ZO_DISPATCH_DTYPE(t, T_, {
    if (tile_for(sh.hs) == 64) {
      forward_typed<T_, 64, 1>(out, lse, qkv, sh, s);
    } else {
      forward_typed<T_, 32, 2>(out, lse, qkv, sh, s);
    }
  });
}

}  // namespace zo::gpu
