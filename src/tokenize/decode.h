// Token ids back to text (byte-level decoding: each token's bytes, concatenated).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tokenize/tokenizer.h"
#include "tokenize/utf8.h"

namespace zo::tokenize {

// Valid UTF-8: bytes that cannot form a character, and ids without a token (a padded
// vocabulary's extra rows), become U+FFFD; a character left incomplete by the last token is held
// back (not printed), since more tokens would have completed it.
std::string decode_text(const Tokenizer& tokenizer, std::span<const std::int32_t> ids);

// decode_text one id at a time: the text of ids pushed one by one, concatenated, is
// decode_text of them all.
class TextDecoder {
 public:
  explicit TextDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(std::int32_t id);

 private:
  const Tokenizer& tokenizer_;
  Utf8Stream text_;
};

}  // namespace zo::tokenize
