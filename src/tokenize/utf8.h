// UTF-8 facts the tokenizer needs: strict validation (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF), NFC through utf8proc, and a decoder for streamed bytes that holds
// back an incomplete character instead of printing it broken.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace zo::tokenize {

inline constexpr std::size_t kValidUtf8 = std::string_view::npos;

// The byte offset of the first byte that does not start a well-formed character, or kValidUtf8.
std::size_t first_invalid_utf8(std::string_view s);

// Unicode Normalization Form C of valid UTF-8 (returned as is when every character is below
// U+0300).
std::string to_nfc(std::string_view s);

// Bytes in, printable UTF-8 out: an incomplete character at the end is kept for the next push;
// bytes that can never form a character become U+FFFD.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string finish();  // what is still held back, as U+FFFD

 private:
  std::string pending_;
};

}  // namespace zo::tokenize
