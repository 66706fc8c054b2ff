// libFuzzer target: a Hugging Face tokenizer.json, as `tokenize --tokenizer` and
// `sample --tokenizer` read it (Tokenizer::load), then what they do with one it accepted:
// encode a text of every kind of character and decode the ids back to the same bytes. The direct
// reader of the vocabulary and merges must agree with the JSON tree on every input: the same
// error, or the same spec.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_common.h"
#include "tokenize/decode.h"
#include "tokenize/tokenizer.h"

namespace {

namespace tk = zo::tokenize;

// What a spec says, comparable: the vocabulary sorted, the rest as read.
auto describe(const tk::TokenizerSpec& s) {
  std::vector<std::pair<std::string, std::uint32_t>> vocab;
  for (const auto& e : s.vocab.entries())
    vocab.emplace_back(e.token, e.id);
  std::sort(vocab.begin(), vocab.end());
  std::vector<std::pair<std::string, std::string>> merges(s.merges.begin(), s.merges.end());
  std::vector<std::tuple<std::uint32_t, std::string, bool>> added;
  for (const auto& a : s.added)
    added.emplace_back(a.id, a.content, a.special);
  return std::tuple(vocab, merges, s.split_patterns, s.nfc, s.add_prefix_space, s.ignore_merges,
                    added);
}

// The spec, or the error's message.
std::pair<std::optional<tk::TokenizerSpec>, std::string> read(const std::string& text,
                                                              bool direct) {
  try {
    return {tk::parse_tokenizer_json(text, "tokenizer.json", direct), ""};
  } catch (const std::exception& e) {
    return {std::nullopt, e.what()};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file = zo::fuzz::scratch_dir() / "tokenizer.json";
  zo::fuzz::write_file(file, std::span(data, size));
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto direct = read(text, true), tree = read(text, false);
  zo::fuzz::require(direct.second == tree.second,
                    "the direct reader and the JSON tree give different errors");
  if (direct.first)
    zo::fuzz::require(describe(*direct.first) == describe(*tree.first),
                      "the direct reader and the JSON tree read different specs");
  zo::fuzz::expect_clear_error([&] {
    const auto t = tk::Tokenizer::load(file.string());
    // Letters, digits, spaces, punctuation, a contraction, CJK, an emoji, a combining mark and a
    // special token's string (tokenized as text).
    const std::string text =
        "Hello, world! It's 2024:  tabs\tand\nnewlines \xE4\xB8\xAD\xE6\x96\x87 "
        "\xF0\x9F\x99\x82 e\xCC\x81 <|endoftext|>";
    const std::vector<std::uint32_t> ids = t->encode(text);
    std::vector<std::int32_t> as_int(ids.begin(), ids.end());
    for (const std::uint32_t id : ids)
      zo::fuzz::require(id < t->vocab_size(), "an id at or above the vocabulary size");
    (void)zo::tokenize::decode_text(*t, as_int);
  });
  return 0;
}
