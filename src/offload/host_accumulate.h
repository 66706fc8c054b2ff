// Host-side gradient accumulation for the offload engine: one bucket of a micro-batch's
// gradients (as copied from the device: fp32, fp16 or bf16) added into fp32 host gradients.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace zo::offload {

// acc (n) fp32 = (first ? 0 : acc) + src (n, dtype). Returns the sum of squares of the result in
// double when `want_sumsq` (the last micro-batch: the global norm of the accumulated gradient),
// else 0. Parallel over cpu_adam-sized chunks (TBB).
double accumulate_grads(float* acc, const void* src, DType dtype, std::size_t n, bool first,
                        bool want_sumsq);

}  // namespace zo::offload
