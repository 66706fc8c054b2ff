// The dynamic maps of the 8-bit state (Dettmers, "8-Bit Approximations for Parallelism in Deep
// Learning", arXiv 1511.04561; block-wise for optimizers in arXiv 2110.02861), defined by the
// float arithmetic that codes them (q8_codec.h), and their constants.
//
// Decade E of a `bits`-bit magnitude map holds the codes with E leading zeros: c = 2^F + f, with
// F = bits - 1 - E fraction bits f, worth about 10^-E * (0.1 + 0.9 * (f + 1) / 2^F). In float:
// value(c) = fmaf(c, S, C) with S = 10^-E * 0.9 / 2^F and C placing the decade's top code at
// 10^-E. Each decade's lowest value lies above the next decade's top, so the magnitudes ascend
// without repeats: 7 bits (m, with a sign) give 127 of them, 8 bits (v) 255, with 0 beside.
#include "q8_tables.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "q8_codec.h"
#include "simd_scalar.h"

namespace zo::cpu_adam::detail {
namespace {

[[noreturn]] void broken(const std::string& what) {
  throw std::logic_error("q8 map: " + what);
}

void fill_decoder(Q8Map& m) {
  for (int f = 0; f < 8; ++f) {
    const int e = m.bits - 1 - f;
    float s = std::numeric_limits<float>::quiet_NaN(), c = s;  // no decade: the signed 128
    if (e >= 0) {
      const double top = std::pow(10.0, -e);
      s = float(top * 0.9 / std::ldexp(1.0, f));
      c = float(top - (std::ldexp(1.0, f + 1) - 1.0) * double(s));
    }
    const int slot = q8_slot_of_fraction_bits(f);
    m.scale[slot] = m.scale[slot ^ 8] = s;  // ^ 8: the same entry for AVX2's 8-entry read
    m.offset[slot] = m.offset[slot ^ 8] = c;
  }
  const Q8Decoder<ScalarIsa> decoder(m);
  const int codes = 1 << m.bits;
  for (int c = 0; c < codes; ++c) {
    m.value[c] = decoder.value<false>(c);
    if (c > 0 && !(m.value[c] > m.value[c - 1])) {
      broken("magnitudes do not ascend at code " + std::to_string(c));
    }
  }
  if (m.value[codes - 1] != 1.0f) broken("the top code is not 1");
}

// Bin b of `bins` covers exponent fields [(kLo + b) << kShift, (kLo + b + 1) << kShift); the
// first reaches down to 0, the last up to infinity. At most `most` thresholds may lie inside one.
template <int kShift>
void fill_bins(const Q8Map& m, Q8Bins<kShift>& bins, int most) {
  using B = Q8Bins<kShift>;
  for (int b = 0; b < B::kCount; ++b) {
    const double lo = b == 0 ? 0.0 : std::ldexp(1.0, ((B::kLo + b) << kShift) - 127);
    const double hi = b == B::kCount - 1 ? std::numeric_limits<double>::infinity()
                                         : std::ldexp(1.0, ((B::kLo + b + 1) << kShift) - 127);
    int above = 0;
    std::vector<float> inside;
    for (int k = 0; k < m.bits; ++k) {
      if (m.threshold[k] >= hi) ++above;
      if (m.threshold[k] >= lo && m.threshold[k] < hi) {
        if (k != above + int(inside.size())) broken("thresholds do not descend");
        inside.push_back(m.threshold[k]);
      }
    }
    if (int(inside.size()) > most) broken("too many thresholds in one bin");
    bins.map[b] = above;
    bins.upper[b] = inside.size() > 0 ? inside[0] : 0.0f;
    bins.lower[b] = inside.size() > 1 ? inside[1] : 0.0f;
  }
}

// The map of x by `bins`, as the vector layers find it.
template <int kShift>
int map_by_bins(const Q8Bins<kShift>& bins, float x) {
  using B = Q8Bins<kShift>;
  const auto key = std::int32_t(std::bit_cast<std::uint32_t>(x) >> (23 + kShift));
  const int b = std::min(std::max(key, B::kLo), B::kLo + B::kCount - 1) & (B::kCount - 1);
  return bins.map[b] + (x < bins.upper[b] ? 1 : 0) + (x < bins.lower[b] ? 1 : 0);
}

// AVX-512's entry of bin_scale and bin_offset for x (simd_avx512.h): the halved exponent field
// raised to 48, read & 31 (16 + the bin), 16 lower where x lies below the bin's threshold.
int avx512_coefficient_entry(const Q8Map& m, float x) {
  const int b = std::max(std::int32_t(std::bit_cast<std::uint32_t>(x) >> 24), Q8Bins<1>::kLo);
  return (x < m.pairs.upper[b & 15] ? b - 16 : b) & 31;
}

// The vector layers find the map from the bin tables, the scalar path counts thresholds: they
// must agree at every threshold and bin edge, one float either side, and NaN.
void check_bins(const Q8Map& m) {
  std::vector<float> edges = {0.0f, std::numeric_limits<float>::denorm_min(), 1.0f, 2.0f,
                              std::numeric_limits<float>::quiet_NaN()};
  for (int k = 0; k < m.bits - 1; ++k)
    edges.push_back(m.threshold[k]);
  for (int field = 97; field < 128; ++field)
    edges.push_back(std::ldexp(1.0f, field - 127));
  for (const float edge : edges) {
    for (const float x : {std::nextafter(edge, 0.0f), edge, std::nextafter(edge, 4.0f)}) {
      const int count = ScalarIsa::Decades::count(m.threshold, x),
                entry = avx512_coefficient_entry(m, x);
      const bool avx512_domain = !(x >= 2.0f);  // x < 2 or NaN: it has no upper clamp
      if (map_by_bins(m.pairs, x) != count || map_by_bins(m.quads, x) != count ||
          (avx512_domain && (m.bin_scale[entry] != m.to_code_scale[count] ||
                             m.bin_offset[entry] != m.to_code_offset[count])))
        broken("bin tables disagree at " + std::to_string(x));
    }
  }
}

void fill_encoder(Q8Map& m) {
  for (int k = 0; k < 8; ++k) {
    m.threshold[k] = -std::numeric_limits<float>::infinity();
    if (k < m.bits - 2) m.threshold[k] = m.value[(1 << (m.bits - 1 - k)) - 1];
  }
  m.threshold[m.bits - 2] = m.value[1] / 2.0f;  // exact
  for (int j = 0; j < 16; ++j) {
    m.to_code_scale[j] = m.to_code_offset[j] = 0.0f;
    if (j > m.bits - 2) continue;
    const int f = m.bits - 1 - j;
    const double scale = m.scale[q8_slot_of_fraction_bits(f)];
    m.to_code_scale[j] = float(1.0 / scale);
    m.to_code_offset[j] = float(std::ldexp(1.0, f) - double(m.value[1 << f]) / scale);
  }
  fill_bins(m, m.pairs, 1);
  fill_bins(m, m.quads, 2);
  for (int b = 0; b < 16; ++b) {
    for (const int below : {0, 1}) {
      const int at = below ? b : b + 16, j = m.pairs.map[b] + below;
      m.bin_scale[at] = m.to_code_scale[j];
      m.bin_offset[at] = m.to_code_offset[j];
    }
  }
  check_bins(m);
  // Every code quantizes to itself.
  const Q8Encoder<ScalarIsa> encoder(m);
  for (int c = 0; c < (1 << m.bits); ++c) {
    const bool mirrored = m.zero_code != 0;
    const std::int32_t got =
        mirrored ? encoder.code<true>(m.value[c]) : encoder.code<false>(m.value[c]);
    const std::int32_t got_negative = mirrored ? encoder.code<true>(-m.value[c]) : m.zero_code - c;
    if (got != m.zero_code + c || got_negative != m.zero_code - c) {
      broken("magnitude " + std::to_string(c) + " does not quantize to itself");
    }
  }
}

Q8Map make_map(int bits, std::int32_t zero_code) {
  Q8Map m;
  m.bits = bits;
  m.zero_code = zero_code;
  fill_decoder(m);
  fill_encoder(m);
  return m;
}

Q8Maps make_maps() {
  Q8Maps maps{make_map(7, 127), make_map(8, 0), {}};
  for (int c = 0; c < 255; ++c)
    maps.signed_values[c] = c < 127 ? -maps.m.value[127 - c] : maps.m.value[c - 127];
  maps.signed_values[255] = std::numeric_limits<float>::quiet_NaN();
  return maps;
}

}  // namespace

const Q8Maps& q8_maps() {
  static const Q8Maps maps = make_maps();
  return maps;
}

}  // namespace zo::cpu_adam::detail

namespace zo::cpu_adam {

std::span<const float> q8_map(bool is_signed) {
  const detail::Q8Maps& maps = detail::q8_maps();
  return is_signed ? std::span<const float>(maps.signed_values, 255)
                   : std::span<const float>(maps.v.value, 256);
}

std::uint8_t q8_quantize(float x, bool is_signed) {
  const detail::Q8Maps& maps = detail::q8_maps();
  const Q8Encoder<ScalarIsa> encoder(is_signed ? maps.m : maps.v);
  return static_cast<std::uint8_t>(is_signed ? encoder.code_of_any<true>(x)
                                             : encoder.code_of_any<false>(x));
}

}  // namespace zo::cpu_adam
