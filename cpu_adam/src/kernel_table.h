// The interface between the threaded driver (cpu_adam.cpp) and the per-ISA kernels. Kernels take
// an index range so that the thread pool stays outside the math.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_adam/cpu_adam.h"

namespace zo::cpu_adam::detail {

struct AdamArrays {
  float* p;                   // (n) fp32 master, or nullptr with p16
  void* m;                    // (n) state dtype (q8: codes)
  void* v;                    // (n) state dtype (q8: codes)
  const void* g;              // (n) grad dtype
  void* out;                  // (n) 16-bit params or nullptr
  float* m_absmax = nullptr;  // q8: one per kQ8Block elements from element 0
  float* v_absmax = nullptr;
  std::uint16_t* p16 = nullptr;  // (n) bf16 master, rounded stochastically
  std::uint64_t sr_seed = 0;     // its random bits: sr_bits(sr_seed, t, sr_first_index + i)
  std::uint64_t sr_first_index = 0;
  std::int64_t t = 0;
};

// Returns true if any scaled gradient in [begin, end) was non-finite.
using AdamRangeFn = bool (*)(const AdamArrays&, const zo::AdamScalars&, std::size_t begin,
                             std::size_t end);
using NonFiniteRangeFn = bool (*)(const void* g, float grad_mult, std::size_t begin,
                                  std::size_t end);

enum OutKind : int { kOutNone = 0, kOutF16 = 1, kOutBF16 = 2 };

struct KernelTable {
  // [grad dtype][state f32|bf16][OutKind][L2][master f32|bf16]
  AdamRangeFn adam[3][2][3][2][2];
  // [grad dtype][OutKind][L2][master f32|bf16]; begin is a multiple of kQ8Block
  AdamRangeFn adam_q8[3][3][2][2];
  NonFiniteRangeFn nonfinite[3];  // [grad dtype]
};

const KernelTable& kernels_scalar();
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();
const KernelTable& kernels_avx512_bf16();

}  // namespace zo::cpu_adam::detail
