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

// MurmurHash3's 32-bit finalizer on every lane: a bijection whose every output bit depends on
// every input bit.
template <class V>
inline typename V::I sr_mix32(typename V::I x) {
  x = V::xor_i(x, V::template srli_i<16>(x));
  x = V::mullo_i(x, V::set1_i(static_cast<std::int32_t>(0x85ebca6bu)));
  x = V::xor_i(x, V::template srli_i<13>(x));
  x = V::mullo_i(x, V::set1_i(static_cast<std::int32_t>(0xc2b2ae35u)));
  return V::xor_i(x, V::template srli_i<16>(x));
}

// cpu_adam::sr_bits: the bits of one element.
inline std::uint32_t sr_bits_of(std::uint64_t seed, std::int64_t t, std::uint64_t index) {
  const std::uint32_t x = static_cast<std::uint32_t>(index) ^ sr_range_key(seed, t, index >> 32);
  return static_cast<std::uint32_t>(sr_mix32<ScalarIsa>(static_cast<std::int32_t>(x)));
}

// The bits of a kernel range's elements, by their position i in the call's arrays: the key is
// re-derived when index >> 32 changes, and a vector whose lanes straddle that change (once per
// 2^32 indices) is drawn lane by lane.
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
      key_ = V::set1_i(static_cast<std::int32_t>(sr_range_key(seed_, t_, hi_)));
    }
    const auto lo = static_cast<std::uint32_t>(index);
    if (lo > 0xffffffffu - (V::kWidth - 1)) [[unlikely]] {
      alignas(64) std::uint32_t lanes[V::kWidth];
      for (std::size_t k = 0; k < V::kWidth; ++k)
        lanes[k] = sr_bits_of(seed_, t_, index + k);
      return V::load_i(lanes);
    }
    return sr_mix32<V>(V::xor_i(V::lane_indices(lo), key_));
  }

 private:
  std::uint64_t seed_;
  std::int64_t t_;
  std::uint64_t first_;
  std::uint64_t hi_ = ~std::uint64_t{0};  // no key yet
  typename V::I key_{};
};

}  // namespace
}  // namespace zo::cpu_adam
