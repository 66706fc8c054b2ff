// Host launchers of the causal attention kernels (gpu/attention.cuh has the algorithm, tiling and
// memory notes).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>

#include "gpu/attention.cuh"
#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

constexpr int kMaxHeadSize = 128;
constexpr int kDefaultSmem = 48 * 1024;

using detail::bad_arg;

// Tile rows per block for a head size: 64 up to hs = 64, 32 above (bounds shared memory).
int tile_for(int hs) {
  return hs <= 64 ? 64 : 32;
}

// Checks the shape, the pointers and the dtype; returns the shape with its tiling constants.
// `ptrs` are the storage-type tensors, whose alignment decides the vector path.
AttentionShape make_shape(const char* op, int B, int T, int C, int NH, DType t,
                          std::initializer_list<detail::Named> ptrs) {
  const std::pair<int, const char*> dims[] = {{B, "B"}, {T, "T"}, {C, "C"}, {NH, "NH"}};
  for (const auto& [v, name] : dims) {
    if (v <= 0) bad_arg(op, std::string(name) + " = " + std::to_string(v) + " must be > 0");
  }
  if (C % NH != 0) {
    bad_arg(op, "C = " + std::to_string(C) + " is not a multiple of NH = " + std::to_string(NH) +
                    "; the head size must be a whole number");
  }
  const int hs = C / NH;
  if (hs > kMaxHeadSize) {
    bad_arg(op, "head size C / NH = " + std::to_string(hs) +
                    " is not supported; supported head sizes are 1.." +
                    std::to_string(kMaxHeadSize) + " (GPT-2 uses 64)");
  }
  detail::check_not_null(op, ptrs);
  detail::check_dtype(op, t);
  const int tile = tile_for(hs);
  const std::int64_t n_tiles = (std::int64_t{T} + tile - 1) / tile;
  if (std::int64_t{B} * NH * n_tiles > std::numeric_limits<int>::max() ||
      std::int64_t{B} * NH * T > std::int64_t{std::numeric_limits<int>::max()} * 8) {
    bad_arg(op, "B * NH * T = " + std::to_string(std::int64_t{B} * NH * T) +
                    " is too large for one launch");
  }

  AttentionShape sh{};
  sh.B = B;
  sh.T = T;
  sh.C = C;
  sh.NH = NH;
  sh.hs = hs;
  sh.n4 = (hs + 3) / 4;
  sh.ld = 4 * (sh.n4 | 1);
  sh.n_tiles = static_cast<int>(n_tiles);
  sh.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  sh.scale_log2 = sh.scale * 1.4426950408889634f;
  const std::size_t vec_bytes = 4 * dtype_size(t);
  sh.vec = hs % 4 == 0;
  for (const detail::Named& p : ptrs)
    sh.vec = sh.vec && detail::aligned(p.p, vec_bytes);
  return sh;
}

// Opts `kernel` into `bytes` of dynamic shared memory when that exceeds the 48 KiB default.
template <typename Kernel>
void set_smem(const char* op, Kernel* kernel, std::size_t bytes) {
  if (bytes <= kDefaultSmem) return;
  const int device = detail::current_device();
  const int optin = detail::device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (bytes > static_cast<std::size_t>(optin)) {
    bad_arg(op, "needs " + std::to_string(bytes) + " bytes of shared memory per block; device " +
                    std::to_string(device) + " allows " + std::to_string(optin));
  }
  ZO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

// Shared-memory bytes: `tiles` (kTile, ld) head tiles, `ptiles` (kTile, kTile + 4) score tiles and
// `rows` per-row vectors of kTile floats.
std::size_t smem_bytes(const AttentionShape& sh, int tile, int tiles, int ptiles, int rows) {
  return sizeof(float) * static_cast<std::size_t>(tile) *
         (static_cast<std::size_t>(tiles) * sh.ld + static_cast<std::size_t>(ptiles) * (tile + 4) +
          rows);
}

// Launches `kernel` on one block of kTile * 4 threads per (b, h, tile), with `smem` bytes of
// dynamic shared memory (opted into when above the default).
template <int kTile, typename Kernel, typename... Args>
void launch_tiles(const char* op, Kernel* kernel, std::size_t smem, const AttentionShape& sh,
                  cudaStream_t s, Args... args) {
  set_smem(op, kernel, smem);
  const std::size_t blocks = static_cast<std::size_t>(sh.B) * sh.NH * sh.n_tiles;
  ZO_LAUNCH(static_cast<unsigned>(blocks), kTile * 4, smem, s, kernel)(args..., sh);
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T, int kTile, int kChunks>
void forward_typed(void* out, float* lse, const void* qkv, const AttentionShape& sh,
                   cudaStream_t s) {
  launch_tiles<kTile>("launch_attention_forward", &attention_forward_kernel<T, kTile, kChunks>,
                      smem_bytes(sh, kTile, 3, 1, 0), sh, s, static_cast<T*>(out), lse,
                      static_cast<const T*>(qkv));
}

template <typename T, int kTile, int kChunks>
void backward_typed(void* dqkv, const void* dout, const void* qkv, const void* out,
                    const float* lse, float* scratch, const AttentionShape& sh, cudaStream_t s) {
  constexpr const char* op = "launch_attention_backward";
  const auto* dout_t = static_cast<const T*>(dout);
  const auto* qkv_t = static_cast<const T*>(qkv);
  auto* dqkv_t = static_cast<T*>(dqkv);

  constexpr int kDThreads = 256;  // one warp per (b, h, t) row
  const std::int64_t rows = std::int64_t{sh.B} * sh.NH * sh.T;
  const auto d_blocks = static_cast<unsigned>(detail::ceil_div(rows, std::int64_t{kDThreads / 32}));
  ZO_LAUNCH(d_blocks, kDThreads, 0, s, attention_backward_d_kernel<T>)
  (scratch, dout_t, static_cast<const T*>(out), sh);
  ZO_CUDA_CHECK_LAUNCH();

  // dk/dv and dq write disjoint thirds of dqkv, so their order does not matter.
  launch_tiles<kTile>(op, &attention_backward_dkv_kernel<T, kTile, kChunks>,
                      smem_bytes(sh, kTile, 4, 2, 2), sh, s, dqkv_t, dout_t, qkv_t, lse, scratch);
  launch_tiles<kTile>(op, &attention_backward_dq_kernel<T, kTile, kChunks>,
                      smem_bytes(sh, kTile, 4, 1, 2), sh, s, dqkv_t, dout_t, qkv_t, lse, scratch);
}

}  // namespace

void launch_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                              DType t, cudaStream_t s) {
  const AttentionShape sh =
      make_shape("launch_attention_forward", B, T, C, NH, t, {{out, "out"}, {qkv, "qkv"}});
  detail::check_not_null("launch_attention_forward", {{lse, "lse"}});
  ZO_DISPATCH_DTYPE(t, T_, {
    if (tile_for(sh.hs) == 64) {
      forward_typed<T_, 64, 1>(out, lse, qkv, sh, s);
    } else {
      forward_typed<T_, 32, 2>(out, lse, qkv, sh, s);
    }
  });
}

void launch_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, float* scratch, int B, int T, int C, int NH,
                               DType t, cudaStream_t s) {
  const AttentionShape sh =
      make_shape("launch_attention_backward", B, T, C, NH, t,
                 {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}});
  detail::check_not_null("launch_attention_backward", {{lse, "lse"}, {scratch, "scratch"}});
  ZO_DISPATCH_DTYPE(t, T_, {
    if (tile_for(sh.hs) == 64) {
      backward_typed<T_, 64, 1>(dqkv, dout, qkv, out, lse, scratch, sh, s);
    } else {
      backward_typed<T_, 32, 2>(dqkv, dout, qkv, out, lse, scratch, sh, s);
    }
  });
}

}  // namespace zo::gpu
