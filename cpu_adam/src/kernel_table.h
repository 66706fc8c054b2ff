// The interface between the threaded driver (cpu_adam.cpp) and the per-ISA kernels. Kernels take
// an index range so that the thread pool stays outside the math.
#pragma once

#include <cstddef>

#include "cpu_adam/cpu_adam.h"

namespace zo::cpu_adam::detail {

struct AdamArrays {
  float* p;                   // (n) fp32 master
  void* m;                    // (n) state dtype (q8: codes)
  void* v;                    // (n) state dtype (q8: codes)
  const void* g;              // (n) grad dtype
  void* out;                  // (n) 16-bit params or nullptr
  float* m_absmax = nullptr;  // q8: one per kQ8Block elements from element 0
  float* v_absmax = nullptr;
};

// Returns true if any scaled gradient in [begin, end) was non-finite.
using AdamRangeFn = bool (*)(const AdamArrays&, const zo::AdamScalars&, std::size_t begin,
                             std::size_t end);
using NonFiniteRangeFn = bool (*)(const void* g, float grad_mult, std::size_t begin,
                                  std::size_t end);

enum OutKind : int { kOutNone = 0, kOutF16 = 1, kOutBF16 = 2 };

struct KernelTable {
  AdamRangeFn adam[3][2][3][2];   // [grad dtype][state f32|bf16][OutKind][L2]
  AdamRangeFn adam_q8[3][3][2];   // [grad dtype][OutKind][L2]; begin is a multiple of kQ8Block
  NonFiniteRangeFn nonfinite[3];  // [grad dtype]
};

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();
const KernelTable& kernels_avx512_bf16();

}  // namespace zo::cpu_adam::detail
