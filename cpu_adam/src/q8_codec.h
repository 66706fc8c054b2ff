// Dequantize and quantize one vector of 8-bit state, written once against an ISA layer `V`
// (simd_*.h): arithmetic and in-register table permutes, no memory gathers. Every path runs the
// same float operations in the same order, so all agree bit for bit with the scalar one, which
// also defines cpu_adam::q8_map and q8_quantize. Internal linkage: see core/half_bits.h.
#pragma once

#include "q8_tables.h"

namespace zo::cpu_adam {
namespace {

// A map's dequantizing tables, held in registers for a range.
template <class V>
struct Q8Decoder {
  typename V::Table scale, offset;
  explicit Q8Decoder(const detail::Q8Map& map)
      : scale(V::table(map.scale)), offset(V::table(map.offset)) {}

  // The decoder of k times the values (a block's beta * absmax): both coefficients scaled once,
  // so an update decodes b * m_old with no multiply per element. Code 0 still reads 0, so a NaN
  // k relies on a NaN block holding no code 0 (its codes are all q8_nan_code).
  Q8Decoder times(float k) const {
    Q8Decoder d = *this;
    d.scale = V::scale_table(scale, k);
    d.offset = V::scale_table(offset, k);
    return d;
  }

  // The value of magnitude codes c before the block scale: fmaf(float(c), scale, offset) with
  // the lookups at float(c)'s exponent; 0 for c = 0. kSigned: c is signed (m's code - 127) and
  // the offset takes its sign, so that -c gives exactly minus the value of c.
  template <bool kSigned>
  typename V::F value(typename V::I c) const {
    const typename V::F x = V::to_float(c);
    const typename V::I slot = V::exponent_field(x);
    typename V::F o = V::lookup(offset, slot);
    if constexpr (kSigned) o = V::flip_sign_where_negative(o, x);
    return V::fma_unless_zero(c, x, V::lookup(scale, slot), o);
  }
};

// A map's quantizing tables, held in registers for a range.
template <class V>
struct Q8Encoder {
  typename V::Decades decades;
  typename V::F top;
  explicit Q8Encoder(const detail::Q8Map& map)
      : decades(map), top(V::set1(float((1 << map.bits) - 1))) {}

  // The code of x, a moment over its block's absmax, as an update quantizes it: |x| <= 1 up to the
  // reciprocal's rounding, finite, and for v (!kSigned) never below +0 (a sum of non-negative
  // terms: a negative or NaN moment makes its block a NaN block, which is not quantized). The
  // decade's linear map by thresholds (q8_tables.h), rounded to the nearest integer; below every
  // threshold it gives the code of 0. kSigned (m): the magnitude's code takes x's sign before the
  // rounding, which is symmetric, and 127 is added.
  template <bool kSigned>
  typename V::I code(typename V::F x) const {
    typename V::F a = x;
    if constexpr (kSigned) a = V::abs(x);
    return rounded<kSigned>(x, map(a));
  }

  // The code of any float x, for callers outside an update: as code() where that applies, the
  // magnitude's code for a negative x of v, and the top code for NaN.
  template <bool kSigned>
  typename V::I code_of_any(typename V::F x) const {
    const typename V::F a = V::abs(x);
    return rounded<kSigned>(x, V::min(map(a), top));
  }

 private:
  // a's code before rounding: fmaf(a, scale, offset) by the thresholds.
  typename V::F map(typename V::F a) const {
    typename V::F scale, offset;
    decades.of(a, scale, offset);
    return V::fma(a, scale, offset);
  }

  template <bool kSigned>
  static typename V::I rounded(typename V::F x, typename V::F c) {
    if constexpr (kSigned) c = V::flip_sign_where_negative(c, x);
    const typename V::I code = V::round_to_int(c);
    if constexpr (kSigned) return V::add_i(code, V::set1_i(127));
    return code;
  }
};

}  // namespace
}  // namespace zo::cpu_adam
