#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "gpu/cast.cuh"
#include "gpu/check.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

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
