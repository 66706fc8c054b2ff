// The interface between the threaded driver (cpu_adam.cpp) and the per-ISA kernels. Kernels take
// an index range so that the thread pool stays outside the math.
#pragma once

#include <cstddef>

#include "cpu_adam/cpu_adam.h"

namespace zo::cpu_adam::detail {

// Per-call constants, derived once on the host in double and rounded to float.
struct AdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float neg_step_size;  // -lr / (1 - beta1^t), or -lr without bias correction
  float bc2_rsqrt;      // 1 / sqrt(1 - beta2^t), or 1 without bias correction
  float eps;
  float decay;      // 1 - lr * weight_decay for AdamW, else 1
  float l2;         // weight_decay for L2-style Adam (used only by the L2 kernels)
  float grad_mult;  // StepOptions::grad_multiplier
};

AdamScalars derive_scalars(const AdamConfig& c, std::int64_t t, float grad_multiplier);

struct AdamArrays {
  float* p;       // (n) fp32 master
  void* m;        // (n) state dtype
  void* v;        // (n) state dtype
  const void* g;  // (n) grad dtype
  void* out;      // (n) 16-bit params or nullptr
};

// Returns true if any scaled gradient in [begin, end) was non-finite.
using AdamRangeFn = bool (*)(const AdamArrays&, const AdamScalars&, std::size_t begin,
                             std::size_t end);
using NonFiniteRangeFn = bool (*)(const void* g, float grad_mult, std::size_t begin,
                                  std::size_t end);

enum OutKind : int { kOutNone = 0, kOutF16 = 1, kOutBF16 = 2 };

struct KernelTable {
  AdamRangeFn adam[3][2][3][2];   // [grad dtype][state f32|bf16][OutKind][L2]
  NonFiniteRangeFn nonfinite[3];  // [grad dtype]
};

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();
const KernelTable& kernels_avx512_bf16();

}  // namespace zo::cpu_adam::detail
