// tokenizer.json's two big values read straight from the file's text: the BPE model's "vocab"
// object and "merges" array (Llama 3: 128k tokens, 280k merges) become views into the text, with
// no JSON tree and no string copied unless it holds an escape. Strict: whatever it does not expect
// (a syntax error, a token given twice, an id that is not an unsigned integer below UINT32_MAX, a
// merge that is neither "a b" nor ["a", "b"], a layout it does not know) gives nothing, and the
// caller reads the file the general way instead, which accepts or refuses it with its own words.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenize/tokenizer_spec.h"
#include "tokenize/vocab.h"

namespace zo::tokenize {

struct BpeJson {
  Vocab vocab;
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  // The whole text with those two values replaced by {} and [], for the general JSON reader.
  std::string rest;
};

// `text`: a tokenizer.json whose top-level "model" object holds "vocab" and "merges". Views point
// into `text` or into `strings.owned` (the unescaped strings).
std::optional<BpeJson> read_bpe_json(std::string_view text, SpecStrings& strings);

// `text`: GPT-2's encoder.json, one object of token -> id.
std::optional<Vocab> read_vocab_json(std::string_view text, SpecStrings& strings);

}  // namespace zo::tokenize
