#include "offload/host_accumulate.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <cstdint>
#include <functional>
#include <stdexcept>

#include "cpu_adam/cpu_adam.h"

namespace zo::offload {
namespace {

template <class Load>
double accumulate(float* acc, std::size_t n, bool first, bool want_sumsq, Load&& load) {
  const tbb::blocked_range<std::size_t> all(0, n, cpu_adam::kChunkElements);
  auto add = [&](std::size_t i) { return first ? load(i) : acc[i] + load(i); };
  if (!want_sumsq) {
    tbb::parallel_for(all, [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t i = r.begin(); i < r.end(); ++i)
        acc[i] = add(i);
    });
    return 0.0;
  }
  return tbb::parallel_reduce(
      all, 0.0,
      [&](const tbb::blocked_range<std::size_t>& r, double sum) {
        float part = 0.0f;  // a chunk in fp32, chunks in double: enough for a norm
        for (std::size_t i = r.begin(); i < r.end(); ++i) {
          acc[i] = add(i);
          part += acc[i] * acc[i];
        }
        return sum + double(part);
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
