#include "offload/host_accumulate.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include <cstdint>
#include <functional>
#include <stdexcept>

#include "cpu_adam/cpu_adam.h"

namespace zo::offload {
namespace {

template <class Load>
double accumulate(float* acc, std::size_t n, bool first, bool want_sumsq, Load&& load) {
  const std::size_t grain = cpu_adam::kChunkElements;
  return tbb::parallel_reduce(
      tbb::blocked_range<std::size_t>(0, n, grain), 0.0,
      [&](const tbb::blocked_range<std::size_t>& r, double sum) {
        float part = 0.0f;  // a chunk in fp32, chunks in double: enough for a norm
        for (std::size_t i = r.begin(); i < r.end(); ++i) {
          const float x = first ? load(i) : acc[i] + load(i);
          acc[i] = x;
          part += x * x;
        }
        return want_sumsq ? sum + double(part) : 0.0;
      },
      std::plus<double>());
}

}  // namespace

double accumulate_grads(float* acc, const void* src, DType dtype, std::size_t n, bool first,
                        bool want_sumsq) {
  switch (dtype) {
    case DType::kF32: {
      const auto* s = static_cast<const float*>(src);
      return accumulate(acc, n, first, want_sumsq, [s](std::size_t i) { return s[i]; });
    }
    case DType::kF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return accumulate(acc, n, first, want_sumsq,
                        [s](std::size_t i) { return half_to_float(s[i]); });
    }
    case DType::kBF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      return accumulate(acc, n, first, want_sumsq,
                        [s](std::size_t i) { return bf16_to_float(s[i]); });
    }
  }
  throw std::invalid_argument("accumulate_grads: unsupported gradient dtype");
}

}  // namespace zo::offload
