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

// The map of x in [0, 2) by bins of 2^kShift octaves: the float's exponent field >> kShift
// (its bits >> (23 + kShift)), raised to at least 96 >> kShift, read & (bins - 1); the first bin
// holds everything below it (zero included), the last reaches up to 2 and takes NaN (exponent
// field 255). The thresholds lie at least 10x apart, so a bin of two octaves (4x, AVX-512: 16
// bins) holds at most one of them and one of four octaves (16x, AVX2: 8 bins) at most two
// (checked at start-up).
template <int kShift>
struct Q8Bins {
  static constexpr int kCount = 32 >> kShift;
  static constexpr std::int32_t kLo = 96 >> kShift;
  alignas(64) std::int32_t map[kCount];  // the thresholds above the bin
  alignas(64) float upper[kCount];       // the higher threshold inside the bin, else 0
  alignas(64) float lower[kCount];       // a second, lower one inside it, else 0
};

struct Q8Map {
  int bits = 0;
  std::int32_t zero_code = 0;  // the stored code of 0: 127 for m, 0 for v
  // Dequantize: scale[F] and offset[F] at slot q8_slot_of_fraction_bits(F). In the signed map the
  // slot of F = 7 (magnitude 128: code 255) holds NaN: no code quantizes to it.
  alignas(64) float scale[16];
  alignas(64) float offset[16];
  // Quantize: x is coded by the linear map of decade j, the number of thresholds above it.
  // threshold[k] is decade k + 1's top value, exactly one step S below decade k's lowest, so
  // decade k's map c = fmaf(x, to_code_scale[k], to_code_offset[k]) = 2^F + (x - value(2^F)) / S
  // runs from 2^F - 1 there to 2^(F+1) - 1 at its own top over equally spaced codes: rounded to
  // the nearest even integer it is the nearest code, with no clamp at either end. The last,
  // threshold[bits - 2], lies midway between the smallest value and 0: decade bits - 1 (one code,
  // one step below decade bits - 2) is coded by decade bits - 2's map, which still rounds to it
  // at half its value. The entries after it are -inf; from j = bits - 1 on the coefficients are
  // 0, the magnitude code of 0.
  float threshold[8];
  alignas(64) float to_code_scale[16];
  alignas(64) float to_code_offset[16];
  // The map by the bin of x (Q8Bins): map[b] plus one for each threshold of the bin that x lies
  // below. AVX-512 reads `pairs` (never a lower threshold) and its coefficients straight from
  // bin_scale and bin_offset at the bin + 16, or at the bin where x is below its threshold (one
  // 32-entry permute each); AVX2 reads `quads`.
  Q8Bins<1> pairs;
  Q8Bins<2> quads;
  alignas(64) float bin_scale[32];
  alignas(64) float bin_offset[32];
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
