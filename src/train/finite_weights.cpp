#include "train/finite_weights.h"

#include <cmath>

#include "model/hf_weights.h"

namespace zo::train {
namespace {

// The value x becomes once stored as `dtype`.
float stored(float x, DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return half_to_float(float_to_half(x));
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(x));
    default:
      return x;
  }
}

}  // namespace

std::string first_nonfinite_weight(const model::ParameterLayout& layout, std::size_t offset,
                                   std::span<const float> w, DType dtype) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (std::isfinite(stored(w[i], dtype))) continue;
    const model::TensorInfo& t = layout.tensor_at(offset + i);
    std::string found =
        t.name + " " + model::hf_index(t, offset + i - t.offset) + " = " + std::to_string(w[i]);
    if (std::isfinite(w[i])) found += ", beyond " + std::string(dtype_name(dtype)) + "'s range";
    return found;
  }
  return "";
}

}  // namespace zo::train
