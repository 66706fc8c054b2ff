#include "tokenize/word_cache.h"

#include <cstring>
#include <functional>

namespace zo::tokenize {
namespace {

constexpr std::uint64_t kLow = 0xFFFFFFFFull;
constexpr std::size_t kFirstSlots = 1 << 12;

std::size_t words_for(std::size_t bytes) {
  return (bytes + 3) / 4;
}

}  // namespace

std::uint64_t WordCache::hash(std::string_view word) {
  return std::hash<std::string_view>{}(word);
}

std::optional<std::span<const std::uint32_t>> WordCache::find(std::string_view word,
                                                              std::uint64_t h) const {
  if (slots_.empty()) return std::nullopt;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == 0) return std::nullopt;
    if ((s ^ h) >> 32 != 0) continue;
    const std::uint32_t* e = &entries_[(s & kLow) - 1];
    if ((e[0] & 0xFF) == word.size() && std::memcmp(e + 1, word.data(), word.size()) == 0)
      return std::span(e + 1 + words_for(word.size()), e[0] >> 8);
  }
}

void WordCache::add(std::string_view word, std::uint64_t h, std::span<const std::uint32_t> ids) {
  if (size_ >= kMaxEntries) {
    slots_.clear();
    entries_.clear();
    size_ = 0;
  }
  if (2 * (size_ + 1) > slots_.size()) grow();
  const std::size_t at = entries_.size();
  entries_.resize(at + 1 + words_for(word.size()) + ids.size());
  entries_[at] = static_cast<std::uint32_t>(word.size() | ids.size() << 8);
  std::memcpy(&entries_[at + 1], word.data(), word.size());
  std::memcpy(&entries_[at + 1 + words_for(word.size())], ids.data(), ids.size_bytes());
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = h & mask;
  while (slots_[i] != 0)
    i = (i + 1) & mask;
  slots_[i] = (h & ~kLow) | (at + 1);
  ++size_;
}

void WordCache::grow() {
  std::vector<std::uint64_t> old(slots_.empty() ? kFirstSlots : 2 * slots_.size(), 0);
  old.swap(slots_);
  const std::size_t mask = slots_.size() - 1;
  for (const std::uint64_t s : old) {
    if (s == 0) continue;
    const std::uint32_t* e = &entries_[(s & kLow) - 1];
    const std::uint64_t h =
        hash(std::string_view(reinterpret_cast<const char*>(e + 1), e[0] & 0xFF));
    std::size_t i = h & mask;
    while (slots_[i] != 0)
      i = (i + 1) & mask;
    slots_[i] = s;
  }
}

}  // namespace zo::tokenize
