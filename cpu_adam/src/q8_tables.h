// The 8-bit state's maps and the lookup tables every ISA path quantizes with (q8_tables.cpp).
// Quantizing is a count of map midpoints below |x|, read from a table of buckets of the float's
// bits (27 binary exponents x 256 mantissa steps, each holding at most one midpoint): two table
// loads and one comparison, the same on every path.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zo::cpu_adam::detail {

// Buckets: binary exponents kBucketEmin .. 127 (|x| from 2^-26 to 2), 256 steps each.
inline constexpr std::int32_t kBucketEmin = 101;
inline constexpr std::int32_t kBuckets = (127 - kBucketEmin + 1) * 256;

// One magnitude quantizer over a map of ascending magnitudes starting at 0: the code of |x| is
// lo[b] + (mid[b] < |x|), b its bucket: lo counts the midpoints below the bucket, mid is the one
// inside it (or +inf).
struct MagnitudeTable {
  std::int32_t lo[kBuckets];
  float mid[kBuckets];
};

struct Q8Tables {
  float signed_map[256];              // codes 0..254: -1 .. 0 (code 127) .. 1; 255 is no code (NaN)
  float unsigned_map[256];            // codes 0..255: 0 .. 1
  MagnitudeTable signed_magnitude;    // over the signed map's 128 magnitudes (0 first)
  MagnitudeTable unsigned_magnitude;  // over the unsigned map
};

const Q8Tables& q8_tables();

// The bucket of a non-negative float's bits (scalar form of every ISA layer's bucket()).
inline std::int32_t q8_bucket(std::uint32_t bits) {
  const auto e = static_cast<std::int32_t>(bits >> 23);
  if (e < kBucketEmin) return 0;
  if (e > 127) return kBuckets - 1;
  return ((e - kBucketEmin) << 8) + static_cast<std::int32_t>((bits >> 15) & 0xFF);
}

}  // namespace zo::cpu_adam::detail
