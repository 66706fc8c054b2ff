#include "tokenize/tokenizer.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenize/byte_level.h"
#include "tokenize/utf8.h"

namespace zo::tokenize {
namespace {

constexpr std::uint32_t kMissing = UINT32_MAX;  // no token has this id
constexpr std::size_t kAhead = 16;              // lookups started before the one waited for

// The ids of each merge's left token, right token and their join (kMissing for one not in the
// vocabulary), looked up in parallel blocks, each lookup's memory prefetched kAhead before it.
std::vector<std::array<std::uint32_t, 3>> merge_ids(
    const Vocab& vocab, const std::vector<std::pair<std::string_view, std::string_view>>& merges) {
  std::vector<std::array<std::uint32_t, 3>> ids(merges.size());
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, merges.size(), 8192), [&](const auto& r) {
    struct Lookup {
      std::string joined;
      std::array<std::uint64_t, 3> hash;
    };
    std::array<Lookup, kAhead> ring;
    const auto start = [&](std::size_t i) {
      Lookup& q = ring[i % kAhead];
      const auto [left, right] = merges[i];
      q.joined.assign(left).append(right);
      q.hash = {Vocab::hash(left), Vocab::hash(right), Vocab::hash(q.joined)};
      for (const std::uint64_t h : q.hash)
        vocab.prefetch(h);
    };
    for (std::size_t i = r.begin(); i < std::min(r.end(), r.begin() + kAhead); ++i)
      start(i);
    for (std::size_t i = r.begin(); i < r.end(); ++i) {
      const Lookup& q = ring[i % kAhead];
      const auto [left, right] = merges[i];
      ids[i] = {vocab.find(left, q.hash[0]).value_or(kMissing),
                vocab.find(right, q.hash[1]).value_or(kMissing),
                vocab.find(q.joined, q.hash[2]).value_or(kMissing)};
      if (i + kAhead < r.end()) start(i + kAhead);
    }
  });
  return ids;
}

}  // namespace

// The most ids below the largest that no token has.
constexpr std::uint64_t kMaxUnusedIds = std::uint64_t{1} << 20;

Tokenizer::Tokenizer(TokenizerSpec spec)
    : source_(std::move(spec.source)),
      strings_(std::move(spec.strings)),
      vocab_(std::move(spec.vocab)),
      nfc_(spec.nfc),
      add_prefix_space_(spec.add_prefix_space),
      ignore_merges_(spec.ignore_merges) {
  const auto fail = [&](const std::string& what) {
    throw DataError("tokenizer '" + source_ + "': " + what);
  };
  std::uint64_t size = 0;
  for (const auto& e : vocab_.entries())
    size = std::max<std::uint64_t>(size, e.id + 1ull);
  for (const auto& a : spec.added)
    size = std::max<std::uint64_t>(size, a.id + 1ull);
  // Tables go by id: a few unused ids are common (reserved ones), millions are a broken file
  // that would cost gigabytes.
  const std::uint64_t tokens = vocab_.entries().size() + spec.added.size();
  if (size > tokens + kMaxUnusedIds) {
    fail("its ids run up to " + std::to_string(size - 1) + " for " + std::to_string(tokens) +
         " tokens; more than " + std::to_string(kMaxUnusedIds) +
         " unused ids is not a tokenizer this reads (check the ids in \"model\".\"vocab\" "
         "and \"added_tokens\")");
  }
  vocab_size_ = static_cast<std::uint32_t>(size);
  spans_.resize(vocab_size_);
  // Where several tokens share an id, the last in sorted order gives its bytes, and the first
  // entry outside the alphabet in sorted order is named: as when the JSON tree lists them.
  std::vector<const Vocab::Entry*> owner(vocab_size_, nullptr);
  const Vocab::Entry* bad = nullptr;
  for (const auto& e : vocab_.entries()) {
    const std::size_t at = bytes_.size();
    if (!append_from_byte_level(e.token, bytes_)) {
      if (!bad || e.token < bad->token) bad = &e;
      continue;
    }
    if (owner[e.id] && e.token < owner[e.id]->token) continue;
    owner[e.id] = &e;
    spans_[e.id] = {static_cast<std::uint32_t>(at), static_cast<std::uint32_t>(bytes_.size() - at)};
  }
  if (bad)
    fail("vocab entry \"" + std::string(bad->token) + "\" (id " + std::to_string(bad->id) +
         ") has characters outside the byte-level alphabet");
  for (const auto& a : spec.added) {
    added_[a.content] = a.id;
    spans_[a.id] = {static_cast<std::uint32_t>(bytes_.size()),
                    static_cast<std::uint32_t>(a.content.size())};
    bytes_ += a.content;
    if (a.special) continue;
    matched_.emplace_back(a.content, a.id);
    starts_match_[static_cast<unsigned char>(a.content[0])] = true;
  }
  std::stable_sort(matched_.begin(), matched_.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  for (int b = 0; b < 256; ++b) {
    const std::string s = to_byte_level(std::string(1, static_cast<char>(b)));
    const auto id = vocab_.find(s);
    if (!id) fail("vocab lacks the byte-level token \"" + s + "\" for byte " + std::to_string(b));
    byte_ids_[b] = *id;
  }
  const auto ids = merge_ids(vocab_, spec.merges);
  for (std::size_t rank = 0; rank < ids.size(); ++rank) {
    const auto [li, ri, mi] = ids[rank];
    if (li == kMissing || ri == kMissing || mi == kMissing) {
      const auto [l, r] = spec.merges[rank];
      fail("merge " + std::to_string(rank) + " \"" + std::string(l) + " " + std::string(r) +
           "\" names a token not in the vocab (\"" +
           (li == kMissing   ? std::string(l)
            : ri == kMissing ? std::string(r)
                             : std::string(l) + std::string(r)) +
           "\")");
    }
  }
  merges_.reserve(ids.size());
  for (std::size_t rank = 0; rank < ids.size(); ++rank) {
    if (rank + kAhead < ids.size()) merges_.prefetch(ids[rank + kAhead][0], ids[rank + kAhead][1]);
    merges_.add(ids[rank][0], ids[rank][1], {static_cast<std::uint32_t>(rank), ids[rank][2]});
  }
  for (const auto& p : spec.split_patterns) {
    try {
      splits_.push_back(std::make_unique<SplitRegex>(p));
    } catch (const std::invalid_argument& e) {
      fail(std::string("pre-tokenizer pattern: ") + e.what());
    }
  }
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  return std::make_unique<Tokenizer>(load_tokenizer_spec(path));
}

std::optional<std::uint32_t> Tokenizer::find(std::string_view text) const {
  if (const auto it = added_.find(text); it != added_.end()) return it->second;
  return vocab_.find(to_byte_level(text));
}

std::optional<std::string> Tokenizer::default_document_token() const {
  for (const char* t : {"<|begin_of_text|>", "<|endoftext|>"})
    if (find(t)) return std::string(t);
  return std::nullopt;
}

std::optional<std::string_view> Tokenizer::token_bytes(std::uint32_t id) const {
  if (id >= spans_.size() || spans_[id].size == UINT32_MAX) return std::nullopt;
  return std::string_view(bytes_).substr(spans_[id].at, spans_[id].size);
}

std::vector<std::uint32_t> Tokenizer::encode(std::string_view text) const {
  if (const auto bad = first_invalid_utf8(text); bad != kValidUtf8)
    throw DataError("text is not valid UTF-8 at byte " + std::to_string(bad));
  std::vector<std::uint32_t> out;
  Encoder(*this).encode(text, out);
  return out;
}

std::string_view Tokenizer::normalize(
    std::string_view segment, std::string& storage,
    const std::function<std::string(std::string_view)>& nfc) const {
  if (nfc_) {
    storage = nfc(segment);
    segment = storage;
  }
  if (add_prefix_space_ && !segment.empty() && segment.front() != ' ') {
    if (!nfc_) storage.assign(segment);
    storage.insert(0, 1, ' ');
    segment = storage;
  }
  return segment;
}

Encoder::Encoder(const Tokenizer& tokenizer) : t_(&tokenizer) {
  for (const auto& re : tokenizer.splits_)
    matchers_.emplace_back(*re);
}

void Encoder::encode(std::string_view text, std::vector<std::uint32_t>& out) {
  t_->for_each_segment(
      text, [&](std::string_view segment) { encode_segment(segment, out); },
      [&](std::uint32_t id) { out.push_back(id); });
}

void Encoder::encode_segment(std::string_view text, std::vector<std::uint32_t>& out) {
  if (text.empty()) return;
  std::string storage;
  text = t_->normalize(text, storage, to_nfc);
  encode_from(text, 0, out, [](std::size_t) { return false; });
}

void Encoder::encode_split(std::string_view piece, std::size_t level,
                           std::vector<std::uint32_t>& out) {
  if (level == matchers_.size()) return encode_piece(piece, out);
  auto& m = matchers_[level];
  m.start(piece);
  for (std::string_view p; m.next(p);)
    encode_split(p, level + 1, out);
}

void Encoder::encode_piece(std::string_view piece, std::vector<std::uint32_t>& out) {
  const bool cached = piece.size() <= WordCache::kMaxWord;
  const std::uint64_t h = cached ? WordCache::hash(piece) : 0;
  if (cached) {
    if (const auto ids = cache_.find(piece, h)) {
      out.insert(out.end(), ids->begin(), ids->end());
      return;
    }
  }
  const std::size_t first = out.size();
  bool whole = false;
  if (t_->ignore_merges_) {  // Llama 3: a pre-token that is a token is not merged further
    byte_level_.clear();
    append_byte_level(piece, byte_level_);
    if (const auto id = t_->vocab_.find(byte_level_)) {
      out.push_back(*id);
      whole = true;
    }
  }
  if (!whole) bpe(piece, t_->byte_ids_, t_->merges_, scratch_, out);
  if (cached) cache_.add(piece, h, std::span(out).subspan(first));
}

}  // namespace zo::tokenize
