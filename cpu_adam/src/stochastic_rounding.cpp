// The public scalar forms of the bf16 master weights' stochastic rounding: the definitions every
// ISA path's kernels equal (sr_bits.h, simd_*.h).
#include <bit>

#include "cpu_adam/cpu_adam.h"
#include "simd_scalar.h"
#include "sr_bits.h"

namespace zo::cpu_adam {

std::uint32_t sr_bits(std::uint64_t seed, std::int64_t t, std::uint64_t index) {
  return sr_bits_of(seed, t, index);
}

std::uint16_t bf16_round_stochastic(float x, std::uint32_t r) {
  const float rounded = ScalarIsa::bf16_stochastic(x, static_cast<std::int32_t>(r & 0xffffu));
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(rounded) >> 16);
}

}  // namespace zo::cpu_adam
