// What a byte-level BPE tokenizer is made of, read from a Hugging Face tokenizer.json
// (https://huggingface.co/docs/tokenizers/api/models#tokenizers.models.BPE and the
// pre-tokenizer/normalizer components) or from GPT-2's original encoder.json + vocab.bpe. Every
// field that would change the ids is read; a model, normalizer, pre-tokenizer or option this
// implementation does not have is refused by name, never silently approximated.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenize/vocab.h"

namespace zo::tokenize {

// Where a spec's vocabulary and merges point: the text of the file read and the strings that
// could not be views into it (unescaped JSON strings, the general reader's copies). Shared by the
// copies of a spec and by the Tokenizer made from one.
struct SpecStrings {
  std::string text;
  std::deque<std::string> owned;  // a deque: adding one moves no other
  std::string_view keep(std::string s) { return owned.emplace_back(std::move(s)); }
};

struct AddedToken {
  std::uint32_t id = 0;
  std::string content;   // as text (not byte-level)
  bool special = false;  // special tokens never come out of text; the others do (as in HF)
};

struct TokenizerSpec {
  std::string source;  // the file(s) read, for messages
  std::shared_ptr<SpecStrings> strings = std::make_shared<SpecStrings>();
  Vocab vocab;  // byte-level string -> id (ids below UINT32_MAX); views into `strings`
  std::vector<std::pair<std::string_view, std::string_view>> merges;  // in rank order, the same
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

// The same from the text of a tokenizer.json (`source` names it in messages). The vocabulary and
// merges are read straight from the text (bpe_json.h); a file that reader does not take whole is
// read again as a JSON tree, which also says what is wrong with a bad one. `direct = false` reads
// it as a tree only (the fuzz target compares the two).
TokenizerSpec parse_tokenizer_json(std::string text, const std::string& source, bool direct = true);

}  // namespace zo::tokenize
