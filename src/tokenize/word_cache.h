// One encoder's memo of the ids of the pieces it has encoded: in most text a few thousand words
// make up nearly every piece, so BPE runs rarely. Open addressing over one array of slots, each
// entry's length, bytes and ids next to each other in another, so that a lookup reads a slot and
// then one or two cache lines (a node-based map chases three pointers, and with one cache per
// thread its misses grew with the threads).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace zo::tokenize {

class WordCache {
 public:
  static constexpr std::size_t kMaxWord = 64;          // longer pieces are rare and not kept
  static constexpr std::size_t kMaxEntries = 1 << 20;  // then it starts again, empty

  static std::uint64_t hash(std::string_view word);
  // The ids of `word` (hash(word) is `h`), or nothing.
  std::optional<std::span<const std::uint32_t>> find(std::string_view word, std::uint64_t h) const;
  // `word`: at most kMaxWord bytes, not in the cache; `ids`: at most kMaxWord of them.
  void add(std::string_view word, std::uint64_t h, std::span<const std::uint32_t> ids);

 private:
  void grow();

  std::vector<std::uint64_t> slots_;  // the hash's high half | 1 + the entry's offset; 0: empty
  // Per entry: its word's length | the number of ids << 8, the word's bytes (padded to 4), ids.
  std::vector<std::uint32_t> entries_;
  std::size_t size_ = 0;
};

}  // namespace zo::tokenize
