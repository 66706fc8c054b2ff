// A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2): NFC (when the file asks for it), the
// pre-tokenizer regexes, the byte-level alphabet and BPE over the merges, exactly as Hugging Face's
// tokenizers encodes text with add_special_tokens=False, except that special tokens are never
// recognised inside text (their strings are tokenized as text). Immutable once built; encode
// through one Encoder per thread.
#pragma once

#include <cstdint>
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
  explicit Tokenizer(const TokenizerSpec& spec);
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

 private:
  friend class Encoder;
  std::string source_;
  std::uint32_t vocab_size_ = 0;
  StringMap<std::uint32_t> vocab_;                              // byte-level string -> id
  StringMap<std::uint32_t> added_;                              // content -> id (all added tokens)
  std::vector<std::pair<std::string, std::uint32_t>> matched_;  // non-special, longest first
  bool starts_match_[256] = {};                                 // the first bytes of matched_
  std::vector<std::optional<std::string>> bytes_;               // id -> bytes
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

 private:
  void encode_segment(std::string_view text, std::vector<std::uint32_t>& out);
  void encode_piece(std::string_view piece, std::vector<std::uint32_t>& out);

  const Tokenizer* t_;
  std::vector<SplitRegex::Matcher> matchers_;
  std::vector<std::string_view> pieces_, next_pieces_;
  BpeScratch scratch_;
  StringMap<std::pair<std::uint32_t, std::uint32_t>> cache_;  // word -> (offset, count) in ids_
  std::vector<std::uint32_t> cached_ids_;
};

}  // namespace zo::tokenize
