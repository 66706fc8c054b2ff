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
  static constexpr bool kQ8Interleave = true;  // see Avx2Isa

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

  // 8-bit state (q8): codes as int lanes, 16-entry tables, the code map of a magnitude.
  using I = std::int32_t;
  struct Table {
    float at[16];
  };
  static I set1_i(std::int32_t x) { return x; }
  // Wrapping, as the vector lanes do (the random bits' lane indices pass 2^31).
  static I add_i(I a, I b) {
    return static_cast<I>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
  }
  static I sub_i(I a, I b) {
    return static_cast<I>(static_cast<std::uint32_t>(a) - static_cast<std::uint32_t>(b));
  }
  static I load_u8(const std::uint8_t* p, Full) { return *p; }
  static void store_u8(std::uint8_t* p, I x, Full) { *p = static_cast<std::uint8_t>(x); }
  static Table table(const float* t) {
    Table r;
    for (int i = 0; i < 16; ++i)
      r.at[i] = t[i];
    return r;
  }
  static Table scale_table(Table t, float k) {
    for (float& x : t.at)
      x *= k;
    return t;
  }
  static F lookup(const Table& t, I i) { return t.at[i & 15]; }
  static F to_float(I x) { return static_cast<float>(x); }
  static I exponent_field(F x) {
    return static_cast<I>(__builtin_bit_cast(std::uint32_t, x) >> 23);
  }
  static F flip_sign_where_negative(F a, F s) {
    return __builtin_bit_cast(float, __builtin_bit_cast(std::uint32_t, a) ^
                                         (__builtin_bit_cast(std::uint32_t, s) & 0x80000000u));
  }
  static F fma_unless_zero(I d, F a, F b, F c) { return d != 0 ? fma(a, b, c) : 0.0f; }
  static F min(F a, F b) { return a < b ? a : b; }
  // y is finite and small here; rounds as the vector conversions do, to nearest even.
  static I round_to_int(F y) { return static_cast<I>(__builtin_rintf(y)); }
  static F abs(F x) { return __builtin_fabsf(x); }
  // The map of x: how many thresholds it lies below (the definition), and its coefficients.
  struct Decades {
    const detail::Q8Map& m;
    explicit Decades(const detail::Q8Map& map) : m(map) {}
    static int count(const float* threshold, F x) {
      int j = 0;
      for (int k = 0; k < 8; ++k)
        j += x < threshold[k] ? 1 : 0;
      return j;
    }
    // x's code before rounding is fmaf(x, scale, offset).
    void of(F x, F& scale, F& offset) const {
      const int j = count(m.threshold, x);
      scale = m.to_code_scale[j];
      offset = m.to_code_offset[j];
    }
  };
  // Block maxima of non-negative floats as unsigned bits: Inf and NaN (also a negative one)
  // compare above every finite value and stick.
  static I max_bits(I acc, F x, Full) {
    const std::uint32_t a = static_cast<std::uint32_t>(acc),
                        b = __builtin_bit_cast(std::uint32_t, x);
    return static_cast<I>(a > b ? a : b);
  }
  static std::uint32_t hmax_bits(I a) { return static_cast<std::uint32_t>(a); }

  // Stochastic rounding (bf16 master weights): 32-bit lane arithmetic for the random bits, and
  // H, the 16-bit results of one vector.
  static I xor_i(I a, I b) { return a ^ b; }
  static I xor3_i(I a, I b, I c) { return a ^ b ^ c; }
  static I xor_and_i(I a, I b, I c) { return (a ^ b) & c; }
  template <int kShift>
  static I srli_i(I a) {
    return static_cast<I>(static_cast<std::uint32_t>(a) >> kShift);
  }
  static I mullo_i(I a, I b) {
    return static_cast<I>(static_cast<std::uint32_t>(a) * static_cast<std::uint32_t>(b));
  }
  static I lane_indices(std::uint32_t first) { return static_cast<I>(first); }
  static I load_i(const std::uint32_t* p) { return static_cast<I>(*p); }
  // cpu_adam::bf16_round_stochastic, kept as the float it stands for (the low half zero): r, 16
  // random bits (its high half zero), added below the kept half, then truncated (a carry into the
  // exponent is the next binade, up to Inf); NaN becomes a quiet NaN.
  static F bf16_stochastic(F x, I r) {
    const std::uint32_t u = __builtin_bit_cast(std::uint32_t, x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      return __builtin_bit_cast(float, (u & 0xffff0000u) | 0x00400000u);
    }
    return __builtin_bit_cast(float, (u + static_cast<std::uint32_t>(r)) & 0xffff0000u);
  }
  // Stores x, a bf16 value, as its 16 bits.
  static void store_bf16_exact(std::uint16_t* p, F x, Full) {
    *p = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, x) >> 16);
  }
};

}  // namespace
}  // namespace zo::cpu_adam
