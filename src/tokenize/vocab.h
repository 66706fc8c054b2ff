// A BPE vocabulary: byte-level token text -> id, an open-addressing table over string_views into
// text its owner keeps alive (TokenizerSpec::strings), so that loading a 128k-token vocabulary
// copies no token. Built once, then read by every encoder thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace zo::tokenize {

class Vocab {
 public:
  struct Entry {
    std::string_view token;
    std::uint32_t id;
  };

  void reserve(std::size_t entries);
  // False (and nothing added) when `token` is already there.
  bool add(std::string_view token, std::uint32_t id);
  std::optional<std::uint32_t> find(std::string_view token) const;
  // The id of the token `left` + `right` (joined on the stack, not allocated, when short).
  std::optional<std::uint32_t> find(std::string_view left, std::string_view right) const;

  // In the order they were added.
  const std::vector<Entry>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }

  // For many lookups in a row: hash each, prefetch its slot, then find it (the table is larger
  // than the caches, so a lookup otherwise waits for memory).
  static std::uint64_t hash(std::string_view s);
  void prefetch(std::uint64_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & (slots_.size() - 1)]);
  }
  std::optional<std::uint32_t> find(std::string_view token, std::uint64_t h) const;

 private:
  void rehash(std::size_t slots);
  // The slot holding `token`, or the empty slot where it would go.
  std::size_t probe(std::string_view token, std::uint64_t h) const;

  std::vector<Entry> entries_;
  std::vector<std::uint64_t> hashes_;  // of entries_, for rehash()
  // The hash's high half | 1 + an index into entries_; 0: empty. The high half spares most
  // comparisons of strings.
  std::vector<std::uint64_t> slots_;
};

}  // namespace zo::tokenize
