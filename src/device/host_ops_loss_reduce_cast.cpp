// Host ops: cross-entropy, the reductions over a buffer (sum of squares, non-finite flag) and
// the dtype cast.
#include "device/host_ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "device/host_ops_internal.h"

namespace zo::dev::host {

// ---- loss and reductions ----------------------------------------------------------------------

void cross_entropy(Arena& arena, float* losses, float* dlogits, const float* logits,
                   const std::int32_t* targets, int N, int V, int ld, float dloss_scale) {
  const std::size_t n_rows = std::size_t(N), v = V, lv = ld;
  const std::size_t rows = rows_per_block(v);
  for_blocks(arena, ceil_div(n_rows, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, n_rows);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const std::int32_t target = targets[n];
      if (target < 0 || target >= V) bad_id("cross_entropy", "target", n, target, V);
      const float* x = logits + n * lv;  // (V)
      float m = x[0];
      for (std::size_t j = 1; j < v; ++j)
        m = std::max(m, x[j]);
      double sum = 0.0;
      for (std::size_t j = 0; j < v; ++j)
        sum += std::exp(x[j] - m);
      const double row_lse = double{m} + std::log(sum);  // log-softmax_j = x_j - lse
      losses[n] = static_cast<float>(row_lse - x[target]);
      if (dlogits == nullptr) continue;
      float* d = dlogits + n * lv;  // may alias x: each x[j] is read before d[j] is written
      for (std::size_t j = 0; j < v; ++j) {
        const float prob = std::exp(static_cast<float>(x[j] - row_lse));
        d[j] = dloss_scale * (prob - (j == std::size_t(target) ? 1.0f : 0.0f));
      }
    }
  });
}

void sum_squares(Arena& arena, float* out, const float* data, std::size_t n) {
  // Partial sums per fixed block, added in block order: the same bits for any thread count.
  std::vector<double> partial(ceil_div(n, kElements), 0.0);
  for_blocks(arena, partial.size(), [&](std::size_t blk) {
    const Range r = block_range(blk, kElements, n);
    double s = 0.0;
    for (std::size_t i = r.begin; i < r.end; ++i)
      s += double{data[i]} * data[i];
    partial[blk] = s;
  });
  double total = *out;
  for (double s : partial)
    total += s;
  *out = static_cast<float>(total);
}

void nonfinite_flag(Arena& arena, float* flag, const float* data, std::size_t n) {
  std::atomic<bool> found{false};
  for_blocks(arena, ceil_div(n, kElements), [&](std::size_t blk) {
    const Range r = block_range(blk, kElements, n);
    bool any = false;
    for (std::size_t i = r.begin; i < r.end; ++i)
      any |= !std::isfinite(data[i]);
    if (any) found.store(true, std::memory_order_relaxed);
  });
  if (found.load(std::memory_order_relaxed)) *flag = 1.0f;
}

// ---- cast ---------------------------------------------------------------------------------------

namespace {

template <DType T>
float load_float(const void* p, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::kF16) {
    return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
  } else {
    return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
  }
}

template <DType T>
void store_float(void* p, std::size_t i, float x) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(p)[i] = x;
  } else if constexpr (T == DType::kF16) {
    static_cast<std::uint16_t*>(p)[i] = float_to_half(x);
  } else {
    static_cast<std::uint16_t*>(p)[i] = float_to_bf16(x);
  }
}

template <DType S, DType D>
void cast_typed(Arena& arena, void* dst, const void* src, std::size_t n) {
  if constexpr (S == D) {
    const std::size_t bytes = n * dtype_size(S);
    for_blocks(arena, ceil_div(bytes, kElements * 4), [&](std::size_t blk) {
      const Range r = block_range(blk, kElements * 4, bytes);
      std::memcpy(static_cast<char*>(dst) + r.begin, static_cast<const char*>(src) + r.begin,
                  r.size());
    });
  } else {
    for_elements(arena, n, [&](std::size_t i) { store_float<D>(dst, i, load_float<S>(src, i)); });
  }
}

template <DType S>
void cast_from(Arena& arena, void* dst, DType dst_t, const void* src, std::size_t n) {
  switch (dst_t) {
    case DType::kF32:
      return cast_typed<S, DType::kF32>(arena, dst, src, n);
    case DType::kF16:
      return cast_typed<S, DType::kF16>(arena, dst, src, n);
    case DType::kBF16:
      return cast_typed<S, DType::kBF16>(arena, dst, src, n);
  }
  throw std::invalid_argument("cast: unknown destination dtype");
}

}  // namespace

void cast(Arena& arena, void* dst, DType dst_t, const void* src, DType src_t, std::size_t n) {
  switch (src_t) {
    case DType::kF32:
      return cast_from<DType::kF32>(arena, dst, dst_t, src, n);
    case DType::kF16:
      return cast_from<DType::kF16>(arena, dst, dst_t, src, n);
    case DType::kBF16:
      return cast_from<DType::kBF16>(arena, dst, dst_t, src, n);
  }
  throw std::invalid_argument("cast: unknown source dtype");
}

}  // namespace zo::dev::host
