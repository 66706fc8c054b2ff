// ISA layer: AVX2 + FMA + F16C, 8 floats. Tails fall back to ScalarIsa (identical results).
// Include only from a TU compiled with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "q8_tables.h"

namespace zo::cpu_adam {
namespace {

struct Avx2Isa {
  using F = __m256;
  struct Full {};
  static constexpr std::size_t kWidth = 8;
  static constexpr bool kMaskedTail = false;
  // q8 runs a block's quantizing pass after the next block's update pass, not interleaved with
  // it: 16 registers cannot hold both passes' tables, and the spilled ones turned every permute
  // into a load as well (10% slower in cache on Zen 3).
  static constexpr bool kQ8Interleave = false;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p, Full) { return _mm256_loadu_ps(p); }
  static F load_f16(const std::uint16_t* p, Full) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F load_bf16(const std::uint16_t* p, Full) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(float* p, F x, Full) { _mm256_storeu_ps(p, x); }
  static void store_f16(std::uint16_t* p, F x, Full) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static void store_bf16(std::uint16_t* p, F x, Full) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);      // round to nearest even
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));  // quiet NaN
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan),
                                             _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }

  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static bool any_nan(F a) { return _mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0; }

  // 8-bit state (q8). Tables: the first 8 entries, read at index & 7.
  using I = __m256i;
  using Table = __m256;
  static I set1_i(std::int32_t x) { return _mm256_set1_epi32(x); }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub_i(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I load_u8(const std::uint8_t* p, Full) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_u8(std::uint8_t* p, I x, Full) {  // lanes hold 0..255
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  static Table table(const float* t) { return _mm256_load_ps(t); }
  static Table scale_table(Table t, float k) { return _mm256_mul_ps(t, set1(k)); }
  static F lookup(Table t, I i) { return _mm256_permutevar8x32_ps(t, i); }
  static F to_float(I x) { return _mm256_cvtepi32_ps(x); }
  static I exponent_field(F x) { return _mm256_srli_epi32(_mm256_castps_si256(x), 23); }
  static F flip_sign_where_negative(F a, F s) {
    return _mm256_xor_ps(a, _mm256_and_ps(s, set1(-0.0f)));
  }
  static F fma_unless_zero(I d, F a, F b, F c) {
    const F zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()));
    return _mm256_andnot_ps(zero, fma(a, b, c));
  }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }  // a < b ? a : b
  static I round_to_int(F y) { return _mm256_cvtps_epi32(y); }
  static F abs(F x) { return _mm256_andnot_ps(set1(-0.0f), x); }
  // The map of x from its bin of four octaves (q8_tables.h): three 8-entry permutes and two
  // compares (masks are -1), in place of a compare per threshold, then its coefficients (maps
  // 0..7: an 8-entry permute reads them whole). The bin needs no upper clamp: x < 2, and NaN's
  // exponent field (255) reads bin 7 anyway.
  struct Decades {
    I map;
    F upper, lower, scales, offsets;
    explicit Decades(const detail::Q8Map& m)
        : map(_mm256_load_si256(reinterpret_cast<const __m256i*>(m.quads.map))),
          upper(_mm256_load_ps(m.quads.upper)),
          lower(_mm256_load_ps(m.quads.lower)),
          scales(_mm256_load_ps(m.to_code_scale)),
          offsets(_mm256_load_ps(m.to_code_offset)) {}
    // x's code before rounding is fmaf(x, scale, offset).
    void of(F x, F& scale, F& offset) const {
      const I b = _mm256_max_epi32(_mm256_srli_epi32(_mm256_castps_si256(x), 25),
                                   set1_i(detail::Q8Bins<2>::kLo));
      I j = _mm256_permutevar8x32_epi32(map, b);
      j = _mm256_sub_epi32(
          j, _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_permutevar8x32_ps(upper, b), _CMP_LT_OQ)));
      j = _mm256_sub_epi32(
          j, _mm256_castps_si256(_mm256_cmp_ps(x, _mm256_permutevar8x32_ps(lower, b), _CMP_LT_OQ)));
      scale = _mm256_permutevar8x32_ps(scales, j);
      offset = _mm256_permutevar8x32_ps(offsets, j);
    }
  };
  // Block maxima of non-negative floats as unsigned bits (Inf and NaN stick).
  static I max_bits(I acc, F x, Full) { return _mm256_max_epu32(acc, _mm256_castps_si256(x)); }
  static std::uint32_t hmax_bits(I a) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
    return static_cast<std::uint32_t>(_mm_cvtsi128_si32(m));
  }

  // Stochastic rounding (bf16 master weights).
  static I xor_i(I a, I b) { return _mm256_xor_si256(a, b); }
  static I xor3_i(I a, I b, I c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
  static I xor_and_i(I a, I b, I c) { return _mm256_and_si256(_mm256_xor_si256(a, b), c); }
  template <int kShift>
  static I srli_i(I a) {
    return _mm256_srli_epi32(a, kShift);
  }
  static I mullo_i(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I lane_indices(std::uint32_t first) {
    return _mm256_add_epi32(set1_i(static_cast<std::int32_t>(first)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static I load_i(const std::uint32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static F bf16_stochastic(F x, I r) {  // as ScalarIsa::bf16_stochastic
    const I u = _mm256_castps_si256(x);
    const I high = set1_i(static_cast<std::int32_t>(0xffff0000u));
    const I b = _mm256_and_si256(_mm256_add_epi32(u, r), high);
    const I nan = _mm256_or_si256(_mm256_and_si256(u, high), set1_i(0x00400000));  // quiet NaN
    return _mm256_blendv_ps(_mm256_castsi256_ps(b), _mm256_castsi256_ps(nan),
                            _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static void store_bf16_exact(std::uint16_t* p, F x, Full) {
    const I h = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
};

}  // namespace
}  // namespace zo::cpu_adam
