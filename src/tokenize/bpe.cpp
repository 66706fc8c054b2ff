#include "tokenize/bpe.h"

#include <algorithm>
#include <bit>

namespace zo::tokenize {

void MergeTable::rehash(std::size_t slots) {
  std::vector<Slot> old(slots);
  old.swap(slots_);
  mask_ = slots - 1;
  shift_ = 64 - std::countr_zero(slots);
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    std::size_t i = slot(s.key);
    while (slots_[i].key != kEmpty)
      i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void MergeTable::reserve(std::size_t merges) {
  std::size_t n = 16;
  while (3 * n < 4 * merges)  // at most 3/4 full: short probes in a table that caches better
    n *= 2;
  if (n > slots_.size()) rehash(n);
}

bool MergeTable::add(std::uint32_t left, std::uint32_t right, Merge m) {
  if (4 * (size_ + 1) > 3 * slots_.size()) reserve(2 * (size_ + 1));
  const std::uint64_t k = key(left, right);
  std::size_t i = slot(k);
  for (; slots_[i].key != kEmpty; i = (i + 1) & mask_)
    if (slots_[i].key == k) return false;
  slots_[i] = {k, m};
  ++size_;
  return true;
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
