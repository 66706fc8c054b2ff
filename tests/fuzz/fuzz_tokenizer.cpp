// libFuzzer target: a Hugging Face tokenizer.json, as `tokenize --tokenizer` and
// `sample --tokenizer` read it (Tokenizer::load), then what they do with one it accepted:
// encode a text of every kind of character and decode the ids back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "tokenize/decode.h"
#include "tokenize/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file = zo::fuzz::scratch_dir() / "tokenizer.json";
  zo::fuzz::write_file(file, std::span(data, size));
  zo::fuzz::expect_clear_error([&] {
    const auto t = zo::tokenize::Tokenizer::load(file.string());
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
