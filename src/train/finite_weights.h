// Weights that are not finite where they are used: NaN, Inf, or beyond the range of the dtype
// they are stored in (fp16 overflows above 65504). export, sample and eval refuse them by name.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "core/dtype.h"
#include "model/layout.h"

namespace zo::train {

// The first of the weights `w` (layout elements from `offset` on) that is not finite once stored
// as `dtype`, as "<tensor> [i] = <value>" (", beyond <dtype>'s range" when it is finite before);
// "" when all are.
std::string first_nonfinite_weight(const model::ParameterLayout& layout, std::size_t offset,
                                   std::span<const float> w, DType dtype);

}  // namespace zo::train
