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

  // 8-bit state (q8).
  using I = __m256i;
  static I set1_i(std::int32_t x) { return _mm256_set1_epi32(x); }
  static I load_u8(const std::uint8_t* p, Full) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_u8(std::uint8_t* p, I x, Full) {  // lanes hold 0..255
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  static F gather(const float* table, I i) { return _mm256_i32gather_ps(table, i, 4); }
  static I gather_i(const std::int32_t* table, I i) {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), i, 4);
  }
  static I bucket(F x) {  // q8_bucket on every lane
    const I bits = _mm256_castps_si256(x);
    const I e = _mm256_srli_epi32(bits, 23);
    const I idx =
        _mm256_add_epi32(_mm256_slli_epi32(_mm256_sub_epi32(e, set1_i(detail::kBucketEmin)), 8),
                         _mm256_and_si256(_mm256_srli_epi32(bits, 15), set1_i(0xFF)));
    const I low = _mm256_cmpgt_epi32(set1_i(detail::kBucketEmin), e);
    const I high = _mm256_cmpgt_epi32(e, set1_i(127));
    return _mm256_blendv_epi8(_mm256_andnot_si256(low, idx), set1_i(detail::kBuckets - 1), high);
  }
  static I add_lt(I lo, F mid, F x) {  // the compare mask is -1 where mid < x
    return _mm256_sub_epi32(lo, _mm256_castps_si256(_mm256_cmp_ps(mid, x, _CMP_LT_OQ)));
  }
  static I signed_code(I q, F x) {
    const I neg = _mm256_castps_si256(_mm256_cmp_ps(x, set1(0.0f), _CMP_LT_OQ));
    return _mm256_blendv_epi8(_mm256_add_epi32(set1_i(127), q), _mm256_sub_epi32(set1_i(127), q),
                              neg);
  }
  static F abs(F x) { return _mm256_andnot_ps(set1(-0.0f), x); }
  static F max(F a, F b, Full) { return _mm256_max_ps(a, b); }  // a > b ? a : b
  static F keep_nan(F acc, F x, Full) { return _mm256_add_ps(acc, _mm256_sub_ps(x, x)); }
  static float hmax(F a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
};

}  // namespace
}  // namespace zo::cpu_adam
