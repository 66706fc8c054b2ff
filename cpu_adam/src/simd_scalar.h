// ISA layer: one float at a time, portable. The reference the vector layers equal bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/half_bits.h"
#include "q8_tables.h"

namespace zo::cpu_adam {
namespace {

struct ScalarIsa {
  using F = float;
  struct Full {};
  static constexpr std::size_t kWidth = 1;
  static constexpr bool kMaskedTail = false;

  static F set1(float x) { return x; }
  static F load(const float* p, Full) { return *p; }
  static F load_f16(const std::uint16_t* p, Full) { return f16_bits_to_f32(*p); }
  static F load_bf16(const std::uint16_t* p, Full) { return bf16_bits_to_f32(*p); }
  static void store(float* p, F x, Full) { *p = x; }
  static void store_f16(std::uint16_t* p, F x, Full) { *p = f32_to_f16_bits(x); }
  static void store_bf16(std::uint16_t* p, F x, Full) { *p = f32_to_bf16_bits(x); }

  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  // Builtins, not std::sqrt/std::fma: those are inline functions with external linkage whose
  // out-of-line copies could come from a TU compiled for a wider ISA.
  static F sqrt(F a) { return __builtin_sqrtf(a); }
  static F fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
  static bool any_nan(F a) { return a != a; }

  // 8-bit state (q8): codes as int lanes, table lookups, the magnitude bucket of a float.
  using I = std::int32_t;
  static I load_u8(const std::uint8_t* p, Full) { return *p; }
  static void store_u8(std::uint8_t* p, I x, Full) { *p = static_cast<std::uint8_t>(x); }
  static F gather(const float* table, I i) { return table[i]; }
  static I gather_i(const std::int32_t* table, I i) { return table[i]; }
  static I bucket(F x) { return detail::q8_bucket(__builtin_bit_cast(std::uint32_t, x)); }
  static I add_lt(I lo, F mid, F x) { return lo + (mid < x ? 1 : 0); }
  static I signed_code(I q, F x) { return x < 0.0f ? 127 - q : 127 + q; }
  static F abs(F x) { return __builtin_fabsf(x); }
  static F max(F a, F b, Full) { return a > b ? a : b; }  // the vector layers' semantics
  static F keep_nan(F acc, F x, Full) { return acc + (x - x); }
  static float hmax(F a) { return a; }
};

}  // namespace
}  // namespace zo::cpu_adam
