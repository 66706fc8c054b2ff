// The constants of the 8-bit state's two maps (q8_tables.cpp builds and checks them); the float
// operations that use them are written once, in q8_codec.h.
//
// A map codes magnitudes with `bits` bits (7 for m, whose sign is separate; 8 for v). A magnitude
// code c >= 1 has F = floor(log2 c) fraction bits and lies in decade E = bits - 1 - F (its values
// are at most 10^-E); its value is fmaf(float(c), scale[F], offset[F]), and code 0 is 0.
#pragma once

#include <cstdint>

namespace zo::cpu_adam::detail {

// Lookups by the exponent field of float(c) (127 + F): 16-entry tables read at that & 15; the
// entries repeat every 8, so AVX2's 8-entry permute, which reads & 7, finds the same values.
inline constexpr int q8_slot_of_fraction_bits(int f) {
  return (127 + f) & 15;
}

// The decade of x in [0, 2) by pairs of octaves (AVX-512): its exponent field halved (the float's
// bits >> 24), raised to at least kBinLo, read & 15. Bin 0 holds everything below 2^-29 (zero
// included), bin 15 [0.5, 2) and NaN (exponent field 255). A bin spans a factor of 4 and the
// thresholds lie about 6.5x apart, so at most one falls inside a bin (checked at start-up).
inline constexpr std::int32_t kBinLo = 48;

struct Q8Map {
  int bits = 0;
  std::int32_t zero_code = 0;  // the stored code of 0: 127 for m, 0 for v
  // Dequantize: scale[F] and offset[F] at slot q8_slot_of_fraction_bits(F). In the signed map the
  // slot of F = 7 (magnitude 128: code 255) holds NaN: no code quantizes to it.
  alignas(64) float scale[16];
  alignas(64) float offset[16];
  // Quantize: the decade E of x is how many thresholds x lies below (threshold[k] is midway
  // between decade k's lowest value and decade k + 1's highest; the last is midway between the
  // smallest value and 0); entries from `bits` on are -inf. Decade `bits` is the code of 0.
  float threshold[8];
  // By decade E, whose codes are 2^F + f: f = clamp(round_to_even(fmaf(x, to_fraction_scale,
  // to_fraction_offset)), 0, fraction_max), code = code_base + f, with code_base = zero_code +
  // 2^F. (Rounding f rather than the code keeps the float's resolution at x: the midpoints hold
  // within an ulp or two.) At E = bits the entries give zero_code; from bits + 1 on they are 0.
  alignas(64) float to_fraction_scale[16];
  alignas(64) float to_fraction_offset[16];
  alignas(64) float fraction_max[16];
  alignas(64) std::int32_t code_base[16];
  // The decade by the bin of x (see kBinLo): bin_decade[b] thresholds lie above the bin; x is
  // below one more where x < bin_threshold[b] (0 if no threshold lies inside).
  alignas(64) std::int32_t bin_decade[16];
  alignas(64) float bin_threshold[16];
  // value[c]: the magnitude of every code, ascending, 0 first (2^bits entries used).
  float value[256];
};

struct Q8Maps {
  Q8Map m;  // 7-bit magnitudes; codes are 127 +/- magnitude
  Q8Map v;  // 8-bit magnitudes
  // The public signed map: codes 0..254 from -1 to 1 (127 is 0); 255 is no code (NaN).
  float signed_values[256];
};

const Q8Maps& q8_maps();

}  // namespace zo::cpu_adam::detail
