// ISA layer: AVX2 + FMA + F16C, 8 floats. Tails fall back to ScalarIsa (identical results).
// Include only from a TU compiled with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

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
};

}  // namespace
}  // namespace zo::cpu_adam
