// Exact scalar conversions between fp32 and the 16-bit formats, bit manipulation only: the
// definition behind zo::float_to_half & co. (core/dtype.h) and cpu_adam's scalar ISA layer.
// Internal linkage on purpose: cpu_adam compiles this header into translation units built with
// different ISA flags, and an inline function with external linkage could be merged across them.
#pragma once

#include <bit>
#include <cstdint>

namespace zo {
namespace {

// Round to nearest, ties to even, of `value >> shift` (0 < shift < 32).
inline std::uint32_t shift_right_rne(std::uint32_t value, unsigned shift) {
  const std::uint32_t q = value >> shift;
  const std::uint32_t rem = value & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // Inf, or NaN made quiet keeping the top payload bits
    const std::uint32_t nan = ax > 0x7f800000u ? (0x0200u | ((ax >> 13) & 0x03ffu)) : 0u;
    return static_cast<std::uint16_t>(sign | 0x7c00u | nan);
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 -> Inf
  if (ax >= 0x38800000u) {  // normal half: rebias the exponent (127 -> 15), round 13 bits away
    return static_cast<std::uint16_t>(sign | shift_right_rne(ax - 0x38000000u, 13));
  }
  if (ax <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25 -> 0
  // Subnormal half: units of 2^-24. ax = mant * 2^(e-150), so units = mant * 2^(e-126).
  const std::uint32_t e = ax >> 23;
  const std::uint32_t mant = (ax & 0x007fffffu) | 0x00800000u;
  return static_cast<std::uint16_t>(sign | shift_right_rne(mant, 126u - e));
}

inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x03ffu;
  if (e == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(mag) | sign);
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (mant << 13));
}

inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7fff plus the lsb of the kept half rounds to nearest even; a carry into the exponent
  // is the correct result, up to Inf.
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace
}  // namespace zo
