// The dynamic maps of the 8-bit state (Dettmers, "8-Bit Approximations for Parallelism in Deep
// Learning", arXiv 1511.04561; block-wise for optimizers in arXiv 2110.02861) and their bucket
// tables. A magnitude code of `bits` bits is E leading zeros (the decade, 10^-E), a 1, and
// F = bits - 1 - E fraction bits f: 10^-E * (0.1 + 0.9 * (f + 1) / 2^F). Each decade's top value is
// 10^-E exactly and its lowest lies above the next decade's top, so the magnitudes ascend without
// repeats: 7 bits (m, with a sign) give 127 of them, 8 bits (v) 255, with 0 beside.
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "q8_tables.h"

namespace zo::cpu_adam::detail {
namespace {

// 0 and the magnitudes of `bits` bits, ascending.
std::vector<float> magnitudes(int bits) {
  std::vector<float> out = {0.0f};
  for (int e = bits - 1; e >= 0; --e) {  // smallest decade first
    const int frac_bits = bits - 1 - e;
    const double steps = std::ldexp(1.0, frac_bits);
    for (int f = 0; f < int(steps); ++f)
      out.push_back(float(std::pow(10.0, -e) * (0.1 + 0.9 * (f + 1) / steps)));
  }
  for (std::size_t i = 1; i < out.size(); ++i) {
    if (!(out[i] > out[i - 1])) throw std::logic_error("q8 map: magnitudes do not ascend");
  }
  return out;
}

void build(MagnitudeTable& t, const std::vector<float>& mags) {
  std::vector<float> mids;
  for (std::size_t j = 0; j + 1 < mags.size(); ++j)
    mids.push_back(float((double(mags[j]) + double(mags[j + 1])) / 2.0));
  std::size_t below = 0;  // midpoints below the current bucket
  for (std::int32_t b = 0; b < kBuckets; ++b) {
    const auto low = std::bit_cast<float>(std::uint32_t((kBucketEmin << 23) + (b << 15)));
    const float high =
        b + 1 < kBuckets
            ? std::bit_cast<float>(std::uint32_t((kBucketEmin << 23) + ((b + 1) << 15)))
            : std::numeric_limits<float>::infinity();
    // Bucket 0 also stands for everything below 2^-26: no midpoint may lie there.
    while (below < mids.size() && mids[below] < low) {
      if (b == 0) throw std::logic_error("q8 map: a midpoint lies below the first bucket");
      ++below;
    }
    t.lo[b] = std::int32_t(below);
    t.mid[b] = std::numeric_limits<float>::infinity();
    if (below < mids.size() && mids[below] < high) {
      t.mid[b] = mids[below];
      if (below + 1 < mids.size() && mids[below + 1] < high) {
        throw std::logic_error("q8 map: two midpoints in one bucket");
      }
    }
  }
}

Q8Tables make_tables() {
  Q8Tables t{};
  const std::vector<float> s = magnitudes(7), u = magnitudes(8);  // 128 and 256 values
  for (int c = 0; c < 255; ++c)
    t.signed_map[c] = c < 127 ? -s[std::size_t(127 - c)] : s[std::size_t(c - 127)];
  t.signed_map[255] = std::numeric_limits<float>::quiet_NaN();
  for (int c = 0; c < 256; ++c)
    t.unsigned_map[c] = u[std::size_t(c)];
  build(t.signed_magnitude, s);
  build(t.unsigned_magnitude, u);
  return t;
}

}  // namespace

const Q8Tables& q8_tables() {
  static const Q8Tables tables = make_tables();
  return tables;
}

}  // namespace zo::cpu_adam::detail

namespace zo::cpu_adam {

std::span<const float> q8_map(bool is_signed) {
  const detail::Q8Tables& t = detail::q8_tables();
  return is_signed ? std::span<const float>(t.signed_map, 255)
                   : std::span<const float>(t.unsigned_map, 256);
}

std::uint8_t q8_quantize(float x, bool is_signed) {
  const detail::Q8Tables& t = detail::q8_tables();
  const detail::MagnitudeTable& m = is_signed ? t.signed_magnitude : t.unsigned_magnitude;
  const float a = std::fabs(x);
  const std::int32_t b = detail::q8_bucket(std::bit_cast<std::uint32_t>(a));
  const std::int32_t q = m.lo[b] + (m.mid[b] < a ? 1 : 0);
  if (!is_signed) return std::uint8_t(q);
  return std::uint8_t(x < 0.0f ? 127 - q : 127 + q);
}

}  // namespace zo::cpu_adam
