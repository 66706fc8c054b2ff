// ISA layer: AVX-512 F/DQ/BW/VL, 16 floats, masked tails. kBf16Cvt uses AVX512-BF16's
// vcvtneps2bf16, which flushes subnormal inputs to zero; those lanes are redone with the integer
// rounding so results stay equal to the scalar path. Include only from a TU compiled with
// -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx512bf16 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "q8_tables.h"

namespace zo::cpu_adam {
namespace {

template <bool kBf16Cvt>
struct Avx512Isa {
  using F = __m512;
  using M = __mmask16;
  struct Full {};
  static constexpr std::size_t kWidth = 16;
  static constexpr bool kMaskedTail = true;
  static constexpr bool kQ8Interleave = true;  // see Avx2Isa

  static M tail_mask(std::size_t n) { return static_cast<M>((1u << n) - 1u); }  // n < 16

  static F set1(float x) { return _mm512_set1_ps(x); }

  static F load(const float* p, Full) { return _mm512_loadu_ps(p); }
  static F load(const float* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
  static __m256i load16(const std::uint16_t* p, Full) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m256i load16(const std::uint16_t* p, M m) { return _mm256_maskz_loadu_epi16(m, p); }
  template <class W>
  static F load_f16(const std::uint16_t* p, W w) {
    return _mm512_cvtph_ps(load16(p, w));
  }
  template <class W>
  static F load_bf16(const std::uint16_t* p, W w) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load16(p, w)), 16));
  }

  static void store(float* p, F x, Full) { _mm512_storeu_ps(p, x); }
  static void store(float* p, F x, M m) { _mm512_mask_storeu_ps(p, m, x); }
  static void store16(std::uint16_t* p, __m256i x, Full) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
  }
  static void store16(std::uint16_t* p, __m256i x, M m) { _mm256_mask_storeu_epi16(p, m, x); }
  template <class W>
  static void store_f16(std::uint16_t* p, F x, W w) {
    store16(p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT), w);
  }

  // Round to nearest even with integer arithmetic; NaN becomes a quiet NaN.
  static __m256i bf16_rne_int(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i bias =
        _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), hi,
                             _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
  }
  static __m256i bf16_rne(F x) {
    if constexpr (kBf16Cvt) {
      __m256i r = (__m256i)_mm512_cvtneps_pbh(x);
      const M subnormal = _mm512_fpclass_ps_mask(x, 0x20);  // class: denormal
      if (subnormal) [[unlikely]] {
        r = _mm256_mask_blend_epi16(subnormal, r, bf16_rne_int(x));
      }
      return r;
    } else {
      return bf16_rne_int(x);
    }
  }
  template <class W>
  static void store_bf16(std::uint16_t* p, F x, W w) {
    store16(p, bf16_rne(x), w);
  }

  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static bool any_nan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0; }

  // 8-bit state (q8).
  using I = __m512i;
  using Table = __m512;
  static I set1_i(std::int32_t x) { return _mm512_set1_epi32(x); }
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub_i(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I load_u8(const std::uint8_t* p, Full) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I load_u8(const std::uint8_t* p, M m) {
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p));
  }
  static void store_u8(std::uint8_t* p, I x, Full) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(x));
  }
  static void store_u8(std::uint8_t* p, I x, M m) { _mm512_mask_cvtepi32_storeu_epi8(p, m, x); }
  static Table table(const float* t) { return _mm512_load_ps(t); }
  static Table scale_table(Table t, float k) { return _mm512_mul_ps(t, set1(k)); }
  static F lookup(Table t, I i) { return _mm512_permutexvar_ps(i, t); }
  static F to_float(I x) { return _mm512_cvtepi32_ps(x); }
  static I exponent_field(F x) { return _mm512_srli_epi32(_mm512_castps_si512(x), 23); }
  static F flip_sign_where_negative(F a, F s) {  // a ^ (s & sign bit), one vpternlogd
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(a), _mm512_castps_si512(s), set1_i(std::int32_t(0x80000000u)), 0x78));
  }
  static F fma_unless_zero(I d, F a, F b, F c) {
    return _mm512_maskz_fmadd_ps(_mm512_test_epi32_mask(d, d), a, b, c);
  }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }  // a < b ? a : b
  static I round_to_int(F y) { return _mm512_cvtps_epi32(y); }
  static F abs(F x) { return _mm512_abs_ps(x); }
  // The coefficients of x's map by its bin of two octaves (q8_tables.h): the bin's threshold by
  // a 16-entry permute and one compare, then each coefficient by one 32-entry permute at the bin
  // (& 31: 16 + the bin, as the bin's exponent fields start at 48) or, below the threshold, 16
  // entries lower. The bin needs no upper clamp: x < 2, and NaN's halved exponent field (127)
  // reads bin 15 anyway.
  struct Decades {
    F threshold, scale_lo, scale_hi, offset_lo, offset_hi;
    explicit Decades(const detail::Q8Map& m)
        : threshold(_mm512_load_ps(m.pairs.upper)),
          scale_lo(_mm512_load_ps(m.bin_scale)),
          scale_hi(_mm512_load_ps(m.bin_scale + 16)),
          offset_lo(_mm512_load_ps(m.bin_offset)),
          offset_hi(_mm512_load_ps(m.bin_offset + 16)) {}
    // x's code before rounding is fmaf(x, scale, offset).
    void of(F x, F& scale, F& offset) const {
      I b = _mm512_max_epi32(_mm512_srli_epi32(_mm512_castps_si512(x), 24),
                             set1_i(detail::Q8Bins<1>::kLo));
      const F t = _mm512_permutexvar_ps(b, threshold);
      b = _mm512_mask_sub_epi32(b, _mm512_cmp_ps_mask(x, t, _CMP_LT_OQ), b, set1_i(16));
      scale = _mm512_permutex2var_ps(scale_lo, b, scale_hi);
      offset = _mm512_permutex2var_ps(offset_lo, b, offset_hi);
    }
  };
  // Block maxima of non-negative floats as unsigned bits (Inf and NaN stick).
  static I max_bits(I acc, F x, Full) { return _mm512_max_epu32(acc, _mm512_castps_si512(x)); }
  static I max_bits(I acc, F x, M m) {
    return _mm512_mask_max_epu32(acc, m, acc, _mm512_castps_si512(x));
  }
  static std::uint32_t hmax_bits(I a) { return _mm512_reduce_max_epu32(a); }

  // Stochastic rounding (bf16 master weights).
  static I xor_i(I a, I b) { return _mm512_xor_si512(a, b); }
  static I xor3_i(I a, I b, I c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }
  static I xor_and_i(I a, I b, I c) { return _mm512_ternarylogic_epi32(a, b, c, 0x28); }
  template <int kShift>
  static I srli_i(I a) {
    return _mm512_srli_epi32(a, kShift);
  }
  static I mullo_i(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I lane_indices(std::uint32_t first) {
    return _mm512_add_epi32(
        set1_i(static_cast<std::int32_t>(first)),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  static I load_i(const std::uint32_t* p) { return _mm512_loadu_si512(p); }
  static F bf16_stochastic(F x, I r) {  // as ScalarIsa::bf16_stochastic
    const I u = _mm512_castps_si512(x);
    const I high = set1_i(static_cast<std::int32_t>(0xffff0000u));
    I b = _mm512_and_si512(_mm512_add_epi32(u, r), high);
    b = _mm512_mask_or_epi32(b, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_and_si512(u, high),
                             set1_i(0x00400000));  // quiet NaN
    return _mm512_castsi512_ps(b);
  }
  template <class W>
  static void store_bf16_exact(std::uint16_t* p, F x, W w) {
    store16(p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)), w);
  }
};

}  // namespace
}  // namespace zo::cpu_adam
