#include "tokenize/vocab.h"

#include <algorithm>
#include <functional>
#include <string>

namespace zo::tokenize {
namespace {

constexpr std::uint64_t kLow = 0xFFFFFFFFull;

std::size_t slots_for(std::size_t entries) {
  std::size_t n = 16;
  while (n < 2 * entries)  // at most half full: short probes
    n *= 2;
  return n;
}

}  // namespace

std::uint64_t Vocab::hash(std::string_view s) {
  return std::hash<std::string_view>{}(s);
}

std::size_t Vocab::probe(std::string_view token, std::uint64_t h) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == 0 || ((s ^ h) >> 32 == 0 && entries_[(s & kLow) - 1].token == token)) return i;
  }
}

void Vocab::rehash(std::size_t slots) {
  slots_.assign(slots, 0);
  const std::size_t mask = slots - 1;
  for (std::size_t e = 0; e < entries_.size(); ++e) {
    std::size_t i = hashes_[e] & mask;
    while (slots_[i] != 0)
      i = (i + 1) & mask;
    slots_[i] = (hashes_[e] & ~kLow) | (e + 1);
  }
}

void Vocab::reserve(std::size_t entries) {
  entries_.reserve(entries);
  hashes_.reserve(entries);
  if (slots_for(entries) > slots_.size()) rehash(slots_for(entries));
}

bool Vocab::add(std::string_view token, std::uint32_t id) {
  if (slots_for(entries_.size() + 1) > slots_.size()) rehash(2 * slots_for(entries_.size() + 1));
  const std::uint64_t h = hash(token);
  const std::size_t i = probe(token, h);
  if (slots_[i] != 0) return false;
  entries_.push_back({token, id});
  hashes_.push_back(h);
  slots_[i] = (h & ~kLow) | entries_.size();
  return true;
}

std::optional<std::uint32_t> Vocab::find(std::string_view token) const {
  return find(token, hash(token));
}

std::optional<std::uint32_t> Vocab::find(std::string_view token, std::uint64_t h) const {
  if (slots_.empty()) return std::nullopt;
  const std::uint64_t s = slots_[probe(token, h)];
  if (s == 0) return std::nullopt;
  return entries_[(s & kLow) - 1].id;
}

std::optional<std::uint32_t> Vocab::find(std::string_view left, std::string_view right) const {
  // Tokens are short: the joined text is hashed from a stack buffer.
  char buf[256];
  std::string long_text;
  std::string_view joined;
  if (left.size() + right.size() <= sizeof buf) {
    std::copy(right.begin(), right.end(), std::copy(left.begin(), left.end(), buf));
    joined = std::string_view(buf, left.size() + right.size());
  } else {
    long_text.append(left).append(right);
    joined = long_text;
  }
  return find(joined);
}

}  // namespace zo::tokenize
