#include "tokenize/bpe.h"

#include <algorithm>

namespace zo::tokenize {

bool MergeTable::add(std::uint32_t left, std::uint32_t right, Merge m) {
  return table_.emplace(key(left, right), m).second;
}

void bpe(std::string_view word, const std::uint32_t (&byte_ids)[256], const MergeTable& merges,
         BpeScratch& s, std::vector<std::uint32_t>& out) {
  const auto n = static_cast<std::int32_t>(word.size());
  if (n == 1) {
    out.push_back(byte_ids[static_cast<unsigned char>(word[0])]);
    return;
  }
  s.id.resize(word.size());
  s.prev.resize(word.size());
  s.next.resize(word.size());
  s.heap.clear();
  for (std::int32_t i = 0; i < n; ++i) {
    s.id[i] = byte_ids[static_cast<unsigned char>(word[i])];
    s.prev[i] = i - 1;
    s.next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Min-heap on (rank, position): the lowest rank first, the leftmost among equal ranks.
  const auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto consider = [&](std::int32_t i) {
    if (i < 0 || s.next[i] < 0) return;
    if (const auto* m = merges.find(s.id[i], s.id[s.next[i]])) {
      s.heap.push_back({m->rank, static_cast<std::uint32_t>(i), s.id[i], s.id[s.next[i]]});
      std::push_heap(s.heap.begin(), s.heap.end(), later);
    }
  };
  for (std::int32_t i = 0; i + 1 < n; ++i)
    consider(i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), later);
    const auto c = s.heap.back();
    s.heap.pop_back();
    const auto i = static_cast<std::int32_t>(c.pos);
    const std::int32_t j = s.next[i];
    // Stale: the left symbol was merged away (its id changed) or its right neighbour changed.
    if (s.id[i] != c.left || j < 0 || s.id[j] != c.right) continue;
    s.id[i] = merges.find(c.left, c.right)->merged;
    s.next[i] = s.next[j];
    if (s.next[j] >= 0) s.prev[s.next[j]] = i;
    s.id[j] = UINT32_MAX;  // removed
    consider(s.prev[i]);
    consider(i);
  }
  for (std::int32_t i = 0; i >= 0; i = s.next[i])
    out.push_back(s.id[i]);
}

}  // namespace zo::tokenize
