// What a byte-level BPE tokenizer is made of, read from a Hugging Face tokenizer.json
// (https://huggingface.co/docs/tokenizers/api/models#tokenizers.models.BPE and the
// pre-tokenizer/normalizer components) or from GPT-2's original encoder.json + vocab.bpe. Every
// field that would change the ids is read; a model, normalizer, pre-tokenizer or option this
// implementation does not have is refused by name, never silently approximated.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zo::tokenize {

struct AddedToken {
  std::uint32_t id = 0;
  std::string content;   // as text (not byte-level)
  bool special = false;  // special tokens never come out of text; the others do (as in HF)
};

struct TokenizerSpec {
  std::string source;                                        // the file(s) read, for messages
  std::vector<std::pair<std::string, std::uint32_t>> vocab;  // byte-level string -> id
  std::vector<std::pair<std::string, std::string>> merges;   // in rank order
  std::vector<std::string> split_patterns;  // Oniguruma regexes, applied in order (Isolated)
  bool nfc = false;                         // NFC normalizer
  bool add_prefix_space = false;            // ByteLevel: a space before text not starting with one
  bool ignore_merges = false;               // a pre-token in the vocabulary is that one token
  std::vector<AddedToken> added;
};

// GPT-2's pre-tokenizer pattern (the ByteLevel pre-tokenizer with use_regex).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// `path`: a tokenizer.json, a directory holding one, or a directory holding encoder.json and
// vocab.bpe. DataError naming the file and what is wrong or not supported.
TokenizerSpec load_tokenizer_spec(const std::string& path);

// The same from the text of a tokenizer.json (`source` names it in messages).
TokenizerSpec parse_tokenizer_json(const std::string& text, const std::string& source);

}  // namespace zo::tokenize
