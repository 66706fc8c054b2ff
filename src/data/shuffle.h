// Counter-based randomness for the data pipeline: every random choice is a pure function of
// (key, index), so any batch of any epoch can be recomputed from the cursor alone (resume,
// data-parallel ranks, random access into the synthetic stream) and nothing is stored.
#pragma once

#include <cstdint>

namespace zo::data {

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The index-th output of the splitmix64 sequence seeded with `key`.
constexpr uint64_t counter_random(uint64_t key, uint64_t index) {
  return mix64(key + (index + 1) * 0x9e3779b97f4a7c15ULL);
}

// A key for a sub-stream (epoch e, purpose p, ...) derived from a parent key.
constexpr uint64_t derive_key(uint64_t key, uint64_t salt) {
  return mix64(key ^ mix64(salt));
}

// High 64 bits of a 64x64-bit product (portable; no __int128 under -Wpedantic).
constexpr uint64_t mul_high64(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xffffffffULL, a_hi = a >> 32;
  const uint64_t b_lo = b & 0xffffffffULL, b_hi = b >> 32;
  const uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi;
  const uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xffffffffULL) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
}

// Uniform integer in [0, n) from 64 random bits (multiply-high; bias <= n / 2^64).
constexpr uint64_t scale_random(uint64_t bits, uint64_t n) {
  return mul_high64(bits, n);
}

// A seeded bijection of [0, n) evaluated in O(1) time and memory: a balanced Feistel network on
// the smallest even-bit power-of-two domain >= n, with cycle walking to stay inside [0, n)
// (Black & Rogaway 2002). It replaces a stored shuffle of every window of an epoch (80 MB for
// 10M windows) and makes "window at position i of epoch e" a pure function.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key) : n_(n) {
    int bits = 0;
    while (bits < 64 && (uint64_t{1} << bits) < n)
      ++bits;
    half_bits_ = bits < 2 ? 1 : (bits + 1) / 2;
    mask_ = half_bits_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << half_bits_) - 1;
    for (int r = 0; r < kRounds; ++r)
      round_keys_[r] = derive_key(key, static_cast<uint64_t>(r));
  }

  uint64_t size() const { return n_; }

  // Precondition: i < size(). Walks at most a few steps on average (domain < 4n).
  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do {
      x = encrypt(x);
    } while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 6;

  uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask_;
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t next = left ^ (mix64(right ^ round_keys_[r]) & mask_);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  int half_bits_ = 1;
  uint64_t mask_ = 1;
  uint64_t round_keys_[kRounds] = {};
};

}  // namespace zo::data
