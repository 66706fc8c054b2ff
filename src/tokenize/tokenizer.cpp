#include "tokenize/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "tokenize/byte_level.h"
#include "tokenize/utf8.h"

namespace zo::tokenize {
namespace {

// Words longer than this are encoded each time (they are rare and would crowd the cache).
constexpr std::size_t kMaxCachedWord = 64;
constexpr std::size_t kMaxCacheEntries = 1 << 20;

}  // namespace

Tokenizer::Tokenizer(const TokenizerSpec& spec)
    : source_(spec.source),
      nfc_(spec.nfc),
      add_prefix_space_(spec.add_prefix_space),
      ignore_merges_(spec.ignore_merges) {
  const auto fail = [&](const std::string& what) {
    throw DataError("tokenizer '" + source_ + "': " + what);
  };
  for (const auto& [token, id] : spec.vocab) {
    if (!vocab_.emplace(token, id).second) fail("vocab holds \"" + token + "\" twice");
    vocab_size_ = std::max(vocab_size_, id + 1);
  }
  for (const auto& a : spec.added)
    vocab_size_ = std::max(vocab_size_, a.id + 1);
  bytes_.resize(vocab_size_);
  for (const auto& [token, id] : spec.vocab) {
    auto b = from_byte_level(token);
    if (!b)
      fail("vocab entry \"" + token + "\" (id " + std::to_string(id) +
           ") has characters outside the byte-level alphabet");
    bytes_[id] = std::move(*b);
  }
  for (const auto& a : spec.added) {
    added_[a.content] = a.id;
    bytes_[a.id] = a.content;
    if (a.special) continue;
    matched_.emplace_back(a.content, a.id);
    starts_match_[static_cast<unsigned char>(a.content[0])] = true;
  }
  std::stable_sort(matched_.begin(), matched_.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  for (int b = 0; b < 256; ++b) {
    const std::string s = to_byte_level(std::string(1, static_cast<char>(b)));
    const auto it = vocab_.find(s);
    if (it == vocab_.end())
      fail("vocab lacks the byte-level token \"" + s + "\" for byte " + std::to_string(b));
    byte_ids_[b] = it->second;
  }
  for (std::size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [l, r] = spec.merges[rank];
    const auto li = vocab_.find(l), ri = vocab_.find(r), mi = vocab_.find(l + r);
    if (li == vocab_.end() || ri == vocab_.end() || mi == vocab_.end()) {
      fail("merge " + std::to_string(rank) + " \"" + l + " " + r +
           "\" names a token not in the vocab (\"" +
           (li == vocab_.end()   ? l
            : ri == vocab_.end() ? r
                                 : l + r) +
           "\")");
    }
    merges_.add(li->second, ri->second, {static_cast<std::uint32_t>(rank), mi->second});
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
  if (const auto it = vocab_.find(to_byte_level(text)); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::default_document_token() const {
  for (const char* t : {"<|begin_of_text|>", "<|endoftext|>"})
    if (find(t)) return std::string(t);
  return std::nullopt;
}

std::optional<std::string_view> Tokenizer::token_bytes(std::uint32_t id) const {
  if (id >= bytes_.size() || !bytes_[id]) return std::nullopt;
  return std::string_view(*bytes_[id]);
}

std::vector<std::uint32_t> Tokenizer::encode(std::string_view text) const {
  if (const auto bad = first_invalid_utf8(text); bad != kValidUtf8)
    throw DataError("text is not valid UTF-8 at byte " + std::to_string(bad));
  std::vector<std::uint32_t> out;
  Encoder(*this).encode(text, out);
  return out;
}

Encoder::Encoder(const Tokenizer& tokenizer) : t_(&tokenizer) {
  for (const auto& re : tokenizer.splits_)
    matchers_.emplace_back(*re);
}

void Encoder::encode(std::string_view text, std::vector<std::uint32_t>& out) {
  // Non-special added tokens are cut out of the raw text first, leftmost and longest, as HF
  // does; the text between them is normalized and pre-tokenized on its own.
  const auto& matched = t_->matched_;
  if (matched.empty()) return encode_segment(text, out);
  std::size_t begin = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (!t_->starts_match_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const auto hit = std::find_if(matched.begin(), matched.end(), [&](const auto& m) {
      return text.compare(i, m.first.size(), m.first) == 0;
    });
    if (hit == matched.end()) {
      ++i;
      continue;
    }
    encode_segment(text.substr(begin, i - begin), out);
    out.push_back(hit->second);
    i += hit->first.size();
    begin = i;
  }
  encode_segment(text.substr(begin), out);
}

void Encoder::encode_segment(std::string_view text, std::vector<std::uint32_t>& out) {
  if (text.empty()) return;
  std::string normalized;
  if (t_->nfc_) {
    normalized = to_nfc(text);
    text = normalized;
  }
  if (t_->add_prefix_space_ && text.front() != ' ') {
    normalized.insert(0, 1, ' ');
    if (!t_->nfc_) normalized.append(text);
    text = normalized;
  }
  pieces_.assign(1, text);
  for (auto& m : matchers_) {
    next_pieces_.clear();
    for (const auto piece : pieces_)
      m.split(piece, next_pieces_);
    pieces_.swap(next_pieces_);
  }
  for (const auto piece : pieces_)
    encode_piece(piece, out);
}

void Encoder::encode_piece(std::string_view piece, std::vector<std::uint32_t>& out) {
  if (piece.size() <= kMaxCachedWord) {
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      const auto [at, n] = it->second;
      out.insert(out.end(), cached_ids_.begin() + at, cached_ids_.begin() + at + n);
      return;
    }
  }
  const std::size_t first = out.size();
  bool whole = false;
  if (t_->ignore_merges_) {  // Llama 3: a pre-token that is a token is not merged further
    if (const auto it = t_->vocab_.find(to_byte_level(piece)); it != t_->vocab_.end()) {
      out.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) bpe(piece, t_->byte_ids_, t_->merges_, scratch_, out);
  if (piece.size() <= kMaxCachedWord) {
    if (cache_.size() >= kMaxCacheEntries) {
      cache_.clear();
      cached_ids_.clear();
    }
    const auto at = static_cast<std::uint32_t>(cached_ids_.size());
    cached_ids_.insert(cached_ids_.end(), out.begin() + first, out.end());
    cache_.emplace(std::string(piece),
                   std::pair{at, static_cast<std::uint32_t>(out.size() - first)});
  }
}

}  // namespace zo::tokenize
