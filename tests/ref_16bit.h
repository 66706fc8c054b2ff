// Reference 16-bit conversions for the tests, written from IEEE 754 and not from the library's
// code: each float is rounded to its nearer neighbour in exact double arithmetic.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace zo::test {

// The value of an IEEE binary16 bit pattern (exact in float); NaNs stay NaN, quiet, payload kept.
inline float ref_from_f16(std::uint16_t b) {
  const std::uint32_t sign = std::uint32_t{b & 0x8000u} << 16;
  const int exp = (b >> 10) & 0x1f;
  const int man = b & 0x3ff;
  if (exp == 0x1f)
    return std::bit_cast<float>(sign | 0x7f800000u |
                                (man ? 0x400000u | std::uint32_t(man) << 13 : 0u));
  const double mag = exp == 0 ? std::ldexp(double(man), -24) : std::ldexp(1024.0 + man, exp - 25);
  return static_cast<float>(sign ? -mag : mag);
}

// x rounded to binary16, nearest, ties to the even pattern, in exact double arithmetic: |x| over
// its binade's spacing (2^-24 below 2^-14) is split into whole and fraction. Past the largest
// finite value the next one up is 2^16 (the unbounded exponent range's), so |x| >= 65520 gives
// Inf. NaN: quiet, the payload's top 10 bits kept (as the x86 and ARM conversions do).
inline std::uint16_t ref_to_f16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  const double ax = std::fabs(double{x});
  if (ax >= 65520.0) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const int e = ax < 0x1p-14 ? -15 : std::ilogb(ax);  // -15: the subnormal codes, spacing 2^-24
  const double q = std::ldexp(ax, e < -14 ? 24 : 10 - e);  // |x| in spacings: exact
  const double whole = std::floor(q), frac = q - whole;
  const auto n =
      static_cast<std::uint32_t>(whole) +
      (frac > 0.5 || (frac == 0.5 && (static_cast<std::uint32_t>(whole) & 1u)) ? 1u : 0u);
  // Subnormal: the code is n (n = 1024 is 2^-14, the first normal code). Normal: n in [1024, 2048]
  // is 1.mantissa; n = 2048 carries into the next binade's exponent, as the bits do.
  const std::uint32_t code = e < -14 ? n : (std::uint32_t(e + 15) << 10) + (n - 1024);
  return static_cast<std::uint16_t>(sign | code);
}

// x rounded to bf16: the nearer of its two truncation neighbours, ties to the even pattern;
// rounding past the largest finite bf16 gives Inf. NaN: quiet, payload's top bits kept.
inline std::uint16_t ref_to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  if (std::isinf(x)) return static_cast<std::uint16_t>(u >> 16);
  const std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // hi: the next one away from 0
  const double ax = std::fabs(double{x});
  const double dlo = ax - std::fabs(double{std::bit_cast<float>(lo)});
  const double dhi =
      ((hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128)
                                         : std::fabs(double{std::bit_cast<float>(hi)})) -
      ax;
  if (dlo != dhi) return static_cast<std::uint16_t>((dlo < dhi ? lo : hi) >> 16);
  return static_cast<std::uint16_t>((((lo >> 16) & 1u) ? hi : lo) >> 16);
}

inline float ref_from_bf16(std::uint16_t b) {
  return std::bit_cast<float>(std::uint32_t{b} << 16);
}

}  // namespace zo::test
