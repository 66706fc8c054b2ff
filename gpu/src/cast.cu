// Element-type conversion of device arrays (launch_cast, gpu/ops.h): fp32 <-> fp16 <-> bf16 with
// the host converters' rounding, 16-byte packs on the wider side where both pointers allow.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "cast.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

// Grid-stride over whole packs of kVec elements, then one thread per element of the tail
// (fewer than kVec). kVec == 1 is the path for pointers not aligned to a pack.
template <typename Src, typename Dst, int kVec>
__global__ void cast_kernel(const Src* __restrict__ src, Dst* __restrict__ dst, std::size_t n) {
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = n / kVec;
  const auto* src_packs = reinterpret_cast<const Pack<Src, kVec>*>(src);
  auto* dst_packs = reinterpret_cast<Pack<Dst, kVec>*>(dst);
  for (std::size_t p = tid; p < packs; p += stride) {
    const Pack<Src, kVec> in = src_packs[p];
    Pack<Dst, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      out.v[k] = from_float<Dst>(to_float(in.v[k]));
    dst_packs[p] = out;
  }
  const std::size_t i = packs * kVec + tid;
  if (i < n) dst[i] = from_float<Dst>(to_float(src[i]));
}

constexpr const char* kOp = "launch_cast";
constexpr int kThreads = 256;

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with the storage type of `t`.
template <typename F>
void visit_dtype(zo::DType t, F&& f) {
  switch (t) {
    case zo::DType::kF32:
      f(Tag<float>{});
      return;
    case zo::DType::kF16:
      f(Tag<__half>{});
      return;
    case zo::DType::kBF16:
      f(Tag<__nv_bfloat16>{});
      return;
  }
}

using detail::aligned;

int grid_for(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kThreads);
}

template <typename Src, typename Dst>
void launch_typed(const void* src, void* dst, std::size_t n, cudaStream_t stream) {
  // 16-byte accesses on the wider side.
  constexpr int kVec = static_cast<int>(16 / std::max(sizeof(Src), sizeof(Dst)));
  const auto* s = static_cast<const Src*>(src);
  auto* d = static_cast<Dst*>(dst);
  if (aligned(src, sizeof(Src) * kVec) && aligned(dst, sizeof(Dst) * kVec)) {
    ZO_LAUNCH(grid_for(n / kVec), kThreads, 0, stream, cast_kernel<Src, Dst, kVec>)(s, d, n);
  } else {
    ZO_LAUNCH(grid_for(n), kThreads, 0, stream, cast_kernel<Src, Dst, 1>)(s, d, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

std::string describe(zo::DType src_t, zo::DType dst_t, std::size_t n) {
  return std::to_string(n) + " elements, " + std::string(zo::dtype_name(src_t)) + " -> " +
         std::string(zo::dtype_name(dst_t));
}

}  // namespace

void launch_cast(const void* src, zo::DType src_t, void* dst, zo::DType dst_t, std::size_t n,
                 cudaStream_t stream) {
  if (!detail::valid_dtype(src_t) || !detail::valid_dtype(dst_t)) {
    detail::bad_arg(kOp, "invalid DType value (src " + std::to_string(static_cast<int>(src_t)) +
                             ", dst " + std::to_string(static_cast<int>(dst_t)) + ")");
  }
  if (n == 0) return;
  detail::check_not_null(kOp, {{src, "src"}, {dst, "dst"}},
                         [&] { return describe(src_t, dst_t, n); });
  const std::size_t src_size = zo::dtype_size(src_t);
  const std::size_t dst_size = zo::dtype_size(dst_t);
  if (n > std::numeric_limits<std::size_t>::max() / sizeof(float)) {
    detail::bad_arg(kOp, "element count overflows (" + describe(src_t, dst_t, n) + ")");
  }
  if (src_t == dst_t && src == dst) return;
  const auto src_begin = reinterpret_cast<std::uintptr_t>(src);
  const auto dst_begin = reinterpret_cast<std::uintptr_t>(dst);
  if (src_begin < dst_begin + n * dst_size && dst_begin < src_begin + n * src_size) {
    detail::bad_arg(kOp, "src and dst overlap (" + describe(src_t, dst_t, n) +
                             "); cast into a separate buffer");
  }

  if (src_t == dst_t) {
    ZO_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * src_size, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  visit_dtype(src_t, [&](auto src_tag) {
    visit_dtype(dst_t, [&](auto dst_tag) {
      using Src = typename decltype(src_tag)::type;
      using Dst = typename decltype(dst_tag)::type;
      if constexpr (!std::is_same_v<Src, Dst>) launch_typed<Src, Dst>(src, dst, n, stream);
    });
  });
}

}  // namespace zo::gpu
