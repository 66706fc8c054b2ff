// Byte-pair encoding over token ids: a word starts as its bytes' ids and the adjacent pair with
// the lowest merge rank is merged, the leftmost first among equals, until no pair has a merge
// (Sennrich et al. 2016; the order Hugging Face's BPE model applies). O(n log n) per word with a
// heap, so a megabyte-long piece costs no more than its size.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace zo::tokenize {

// (left id, right id) -> (rank, merged id): open addressing on one array, probed once per pair
// of adjacent symbols in every BPE step.
class MergeTable {
 public:
  struct Merge {
    std::uint32_t rank;
    std::uint32_t merged;
  };
  void reserve(std::size_t merges);
  // False when the pair already has a merge (the first, lower rank, is kept). Ids are below
  // UINT32_MAX.
  bool add(std::uint32_t left, std::uint32_t right, Merge m);
  void prefetch(std::uint32_t left, std::uint32_t right) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[slot(key(left, right))]);
  }
  const Merge* find(std::uint32_t left, std::uint32_t right) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t k = key(left, right);
    for (std::size_t i = slot(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t kEmpty = UINT64_MAX;  // no pair of ids below UINT32_MAX
  struct Slot {
    std::uint64_t key = kEmpty;
    Merge merge{};
  };
  static std::uint64_t key(std::uint32_t l, std::uint32_t r) { return std::uint64_t{l} << 32 | r; }
  // Fibonacci hashing: the high bits of the key times 2^64 / phi.
  std::size_t slot(std::uint64_t k) const {
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void rehash(std::size_t slots);

  std::vector<Slot> slots_;
  std::size_t size_ = 0, mask_ = 0;
  int shift_ = 64;
};

// Reusable buffers for bpe() (one per thread).
struct BpeScratch {
  struct Candidate {
    std::uint32_t rank, pos, left, right;
  };
  std::vector<std::uint32_t> id;
  std::vector<std::int32_t> prev, next;
  std::vector<Candidate> heap;
};

// Appends the ids of `word` to `out`; byte_ids[b] is the id of the single byte b.
void bpe(std::string_view word, const std::uint32_t (&byte_ids)[256], const MergeTable& merges,
         BpeScratch& s, std::vector<std::uint32_t>& out);

}  // namespace zo::tokenize
