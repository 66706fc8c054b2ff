// Byte-pair encoding over token ids: a word starts as its bytes' ids and the adjacent pair with
// the lowest merge rank is merged, the leftmost first among equals, until no pair has a merge
// (Sennrich et al. 2016; the order Hugging Face's BPE model applies). O(n log n) per word with a
// heap, so a megabyte-long piece costs no more than its size.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zo::tokenize {

class MergeTable {
 public:
  struct Merge {
    std::uint32_t rank;
    std::uint32_t merged;
  };
  // False when the pair already has a merge (the first, lower rank, is kept).
  bool add(std::uint32_t left, std::uint32_t right, Merge m);
  const Merge* find(std::uint32_t left, std::uint32_t right) const {
    const auto it = table_.find(key(left, right));
    return it == table_.end() ? nullptr : &it->second;
  }

 private:
  static std::uint64_t key(std::uint32_t l, std::uint32_t r) { return std::uint64_t{l} << 32 | r; }
  std::unordered_map<std::uint64_t, Merge> table_;
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
