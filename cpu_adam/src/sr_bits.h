// The random bits of stochastic rounding (bf16 master weights), written once against an ISA layer
// `V` (simd_*.h), so that every path draws the same bits for the same element. Counter-based (the
// idea of Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011): a hash of
// (seed, t, index) with no state, so threads, buckets and a resumed run all agree. The 64-bit
// part (seed, t, index >> 32) is mixed once per 2^32 indices into a key; every lane then hashes
// its index's low 32 bits xor the key with 32-bit multiplies. Internal linkage: see
// core/half_bits.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "simd_scalar.h"

namespace zo::cpu_adam {
namespace {

// Stafford's "Mix13" 64-bit finalizer, as in splitmix64 (Steele et al., OOPSLA 2014).
inline std::uint64_t sr_mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

// The key of indices hi * 2^32 .. hi * 2^32 + 2^32 - 1 at update t of the run with this seed.
inline std::uint32_t sr_range_key(std::uint64_t seed, std::int64_t t, std::uint64_t hi) {
  return static_cast<std::uint32_t>(
      sr_mix64(sr_mix64(sr_mix64(seed) ^ static_cast<std::uint64_t>(t)) ^ hi));
}

// MurmurHash3's 32-bit finalizer, x ^= x >> 16; x *= c1; x ^= x >> 13; x *= c2; x ^= x >> 16: a
// bijection whose every output bit depends on every input bit. Its middle, on every lane:
template <class V>
inline typename V::I sr_mix32_middle(typename V::I x) {
  x = V::mullo_i(x, V::set1_i(static_cast<std::int32_t>(0x85ebca6bu)));
  x = V::xor_i(x, V::template srli_i<13>(x));
  return V::mullo_i(x, V::set1_i(static_cast<std::int32_t>(0xc2b2ae35u)));
}

inline std::uint32_t sr_mix32(std::uint32_t x) {
  x = static_cast<std::uint32_t>(
      sr_mix32_middle<ScalarIsa>(static_cast<std::int32_t>(x ^ (x >> 16))));
  return x ^ (x >> 16);
}

// The low 16 bits of sr_mix32(lanes ^ key), all that a rounding uses, with the xor-shifts at both
// ends merged into three-input logic (one instruction each on AVX-512): the first is lanes ^
// (lanes >> 16) ^ folded, with folded = key ^ (key >> 16); the last, masked, is (x ^ (x >> 16)) &
// 0xffff.
template <class V>
inline typename V::I sr_low16(typename V::I lanes, typename V::I folded) {
  const typename V::I x =
      sr_mix32_middle<V>(V::xor3_i(lanes, V::template srli_i<16>(lanes), folded));
  return V::xor_and_i(x, V::template srli_i<16>(x), V::set1_i(0xffff));
}

// cpu_adam::sr_bits: the bits of one element.
inline std::uint32_t sr_bits_of(std::uint64_t seed, std::int64_t t, std::uint64_t index) {
  const std::uint32_t x = static_cast<std::uint32_t>(index) ^ sr_range_key(seed, t, index >> 32);
  return sr_mix32(x);
}

// The random bits of a kernel range's elements (the low 16 of sr_bits, what V::bf16_stochastic
// takes), by their position i in the call's arrays: the key is re-derived when index >> 32
// changes, and a vector whose lanes straddle that change (once per 2^32 indices) is drawn lane by
// lane. Consecutive calls (i up by V::kWidth) advance the lane indices by one addition.
template <class V>
class SrStream {
 public:
  SrStream(std::uint64_t seed, std::int64_t t, std::uint64_t first_index)
      : seed_(seed), t_(t), first_(first_index) {}

  // Lanes i .. i + V::kWidth - 1.
  typename V::I bits(std::size_t i) {
    const std::uint64_t index = first_ + i;
    if ((index >> 32) != hi_) {
      hi_ = index >> 32;
      const std::uint32_t key = sr_range_key(seed_, t_, hi_);
      folded_ = V::set1_i(static_cast<std::int32_t>(key ^ (key >> 16)));
    }
    const auto lo = static_cast<std::uint32_t>(index);
    if (lo > 0xffffffffu - (V::kWidth - 1)) [[unlikely]] {
      alignas(64) std::uint32_t lanes[V::kWidth];
      for (std::size_t k = 0; k < V::kWidth; ++k)
        lanes[k] = sr_bits_of(seed_, t_, index + k) & 0xffffu;
      return V::load_i(lanes);
    }
    if (lo != next_lo_) lanes_ = V::lane_indices(lo);
    next_lo_ = lo + static_cast<std::uint32_t>(V::kWidth);  // wraps with the lanes
    const typename V::I r = sr_low16<V>(lanes_, folded_);
    lanes_ = V::add_i(lanes_, V::set1_i(static_cast<std::int32_t>(V::kWidth)));
    return r;
  }

 private:
  std::uint64_t seed_;
  std::int64_t t_;
  std::uint64_t first_;
  std::uint64_t hi_ = ~std::uint64_t{0};  // no key yet
  typename V::I folded_{};
  std::uint32_t next_lo_ = 0;  // lanes_ holds the indices of the call at next_lo_
  typename V::I lanes_ = V::lane_indices(0);
};

}  // namespace
}  // namespace zo::cpu_adam
