// A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2): NFC (when the file asks for it), the
// pre-tokenizer regexes, the byte-level alphabet and BPE over the merges, exactly as Hugging Face's
// tokenizers encodes text with add_special_tokens=False, except that special tokens are never
// recognised inside text (their strings are tokenized as text). Immutable once built; encode
// through one Encoder per thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenize/bpe.h"
#include "tokenize/pre_tokenizer.h"
#include "tokenize/tokenizer_spec.h"
#include "tokenize/vocab.h"
#include "tokenize/word_cache.h"

namespace zo::tokenize {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class Tokenizer {
 public:
  // DataError naming spec.source when the vocabulary and merges do not fit together.
  explicit Tokenizer(TokenizerSpec spec);
  // load_tokenizer_spec(path), then the above.
  static std::unique_ptr<Tokenizer> load(const std::string& path);

  const std::string& source() const { return source_; }
  std::uint32_t vocab_size() const { return vocab_size_; }  // 1 + the largest id

  // The id of a token given as text: an added token's content, or a vocabulary entry.
  std::optional<std::uint32_t> find(std::string_view text) const;
  // <|begin_of_text|> (Llama 3) if present, else <|endoftext|> (GPT-2, Qwen2), else nothing.
  std::optional<std::string> default_document_token() const;

  // The bytes of token `id` (an added token's content), or nothing for an id without a token.
  std::optional<std::string_view> token_bytes(std::uint32_t id) const;

  // Convenience for short texts (the prompt); bulk work uses an Encoder per thread.
  std::vector<std::uint32_t> encode(std::string_view text) const;

  // The steps of Encoder::encode, for encode_parallel. Non-special added tokens are cut out of the
  // raw text first, leftmost and longest, as HF does: calls on_text(segment) for the text
  // between them (possibly empty) and on_added(id) for each, in order.
  template <class OnText, class OnAdded>
  void for_each_segment(std::string_view text, OnText&& on_text, OnAdded&& on_added) const;
  // A segment as the pre-tokenizer sees it: NFC when the file asks for it (done by `nfc`), then
  // ByteLevel's prefix space; `segment` itself or a view of `storage`.
  std::string_view normalize(std::string_view segment, std::string& storage,
                             const std::function<std::string(std::string_view)>& nfc) const;
  // Whether a walk of the first split regex may start at any piece's end (SplitRegex::resumable).
  bool resumable_split() const { return !splits_.empty() && splits_.front()->resumable(); }

 private:
  friend class Encoder;
  struct Span {
    std::uint32_t at = 0, size = UINT32_MAX;  // UINT32_MAX: no token
  };
  std::string source_;
  std::uint32_t vocab_size_ = 0;
  std::shared_ptr<const SpecStrings> strings_;                  // what vocab_ points into
  Vocab vocab_;                                                 // byte-level string -> id
  StringMap<std::uint32_t> added_;                              // content -> id (all added tokens)
  std::vector<std::pair<std::string, std::uint32_t>> matched_;  // non-special, longest first
  bool starts_match_[256] = {};                                 // the first bytes of matched_
  std::string bytes_;                                           // every token's bytes
  std::vector<Span> spans_;                                     // id -> its bytes in bytes_
  std::uint32_t byte_ids_[256] = {};
  MergeTable merges_;
  std::vector<std::unique_ptr<SplitRegex>> splits_;
  bool nfc_ = false, add_prefix_space_ = false, ignore_merges_ = false;
};

// One thread's encoder: regex scratch, BPE buffers and a cache of the words seen.
class Encoder {
 public:
  explicit Encoder(const Tokenizer& tokenizer);
  // Appends the ids of `text` (valid UTF-8: check with first_invalid_utf8 first).
  void encode(std::string_view text, std::vector<std::uint32_t>& out);

  // encode_parallel's unit of work. Appends the ids of the pieces that the first split regex
  // gives in `text` (a normalized segment) from byte `from` on, and calls stop(end) after each
  // piece with the offset where it ends, until that returns true. From 0, or from where a piece
  // of an earlier walk ended (Tokenizer::resumable_split), the pieces are those of Encoder::encode.
  // A first piece that ends past `first_limit` is not encoded and ends the walk: a walk that
  // starts inside a long run of one kind of character leaves the run to the walk that reaches
  // it, so the run is encoded once rather than once per chunk it spans.
  template <class Stop>
  void encode_from(std::string_view text, std::size_t from, std::vector<std::uint32_t>& out,
                   Stop&& stop, std::size_t first_limit = std::string_view::npos);

 private:
  void encode_segment(std::string_view text, std::vector<std::uint32_t>& out);
  // The later split regexes (from `level` on) over one piece, then its tokens.
  void encode_split(std::string_view piece, std::size_t level, std::vector<std::uint32_t>& out);
  void encode_piece(std::string_view piece, std::vector<std::uint32_t>& out);

  const Tokenizer* t_;
  std::vector<SplitRegex::Matcher> matchers_;
  BpeScratch scratch_;
  std::string byte_level_;  // a piece in the alphabet
  WordCache cache_;
};

template <class OnText, class OnAdded>
void Tokenizer::for_each_segment(std::string_view text, OnText&& on_text,
                                 OnAdded&& on_added) const {
  std::size_t begin = 0;
  if (!matched_.empty()) {
    for (std::size_t i = 0; i < text.size();) {
      if (!starts_match_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const auto hit = std::find_if(matched_.begin(), matched_.end(), [&](const auto& m) {
        return text.compare(i, m.first.size(), m.first) == 0;
      });
      if (hit == matched_.end()) {
        ++i;
        continue;
      }
      on_text(text.substr(begin, i - begin));
      on_added(hit->second);
      i += hit->first.size();
      begin = i;
    }
  }
  on_text(text.substr(begin));
}

template <class Stop>
void Encoder::encode_from(std::string_view text, std::size_t from, std::vector<std::uint32_t>& out,
                          Stop&& stop, std::size_t first_limit) {
  if (matchers_.empty()) {  // no regex: the segment is one piece
    if (text.size() > first_limit) return;
    if (from < text.size()) encode_piece(text.substr(from), out);
    stop(text.size());
    return;
  }
  auto& m = matchers_.front();
  m.start(text, from);
  for (std::string_view piece; m.next(piece); first_limit = std::string_view::npos) {
    const auto end = static_cast<std::size_t>(piece.data() + piece.size() - text.data());
    if (end > first_limit) return;
    encode_split(piece, 1, out);
    if (stop(end)) return;
  }
}

}  // namespace zo::tokenize
