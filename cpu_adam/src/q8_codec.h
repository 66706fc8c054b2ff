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
  typename V::Table to_fraction_scale, to_fraction_offset, fraction_max;
  typename V::TableI code_base;
  explicit Q8Encoder(const detail::Q8Map& map)
      : decades(map),
        to_fraction_scale(V::table(map.to_fraction_scale)),
        to_fraction_offset(V::table(map.to_fraction_offset)),
        fraction_max(V::table(map.fraction_max)),
        code_base(V::table_i(map.code_base)) {}

  // The code of x, a moment over its block's absmax (|x| <= 1 or NaN): the decade by thresholds,
  // then the nearest fraction inside it by one FMA rounded to the nearest integer, clamped to the
  // decade's codes. Decade `bits` (|x| below every threshold) reads the code of 0. kSigned (m):
  // 127 + the magnitude code, mirrored around 127 where x < 0.
  template <bool kSigned>
  typename V::I code(typename V::F x) const {
    const typename V::F a = V::abs(x);
    const typename V::I e = decades.of(a);
    typename V::F f = V::fma(a, V::lookup(to_fraction_scale, e), V::lookup(to_fraction_offset, e));
    f = V::min(V::max(f, V::set1(0.0f)), V::lookup(fraction_max, e));
    const typename V::I c =
        decades.finish(V::add_i(V::round_to_int(f), V::lookup_i(code_base, e)), a);
    if constexpr (kSigned) return V::mirror_where_negative(c, x);
    return c;
  }
};

}  // namespace
}  // namespace zo::cpu_adam
