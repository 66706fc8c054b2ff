// The byte-level alphabet of GPT-2-style BPE (Radford et al. 2019, §2.2; Hugging Face's
// ByteLevel pre-tokenizer): every byte is written as one printable code point, so the
// vocabulary and merges are plain strings. Bytes that are printable Latin-1 (0x21-0x7E,
// 0xA1-0xAC, 0xAE-0xFF) stand for themselves; the 68 others, in byte order, become U+0100,
// U+0101, ... (so a space is "Ġ" U+0120, a newline "Ċ" U+010A).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace zo::tokenize {

// The code point that stands for byte b.
char32_t byte_to_code_point(unsigned char b);

// Each byte of `bytes` as the UTF-8 of its code point.
std::string to_byte_level(std::string_view bytes);
void append_byte_level(std::string_view bytes, std::string& out);

// The bytes a byte-level string stands for, or nothing when it holds a character outside the
// alphabet (or is not valid UTF-8).
std::optional<std::string> from_byte_level(std::string_view text);
// The same appended to `out`; false (with `out` unchanged) when `text` is not byte-level.
bool append_from_byte_level(std::string_view text, std::string& out);

// UTF-8 of one code point (below U+110000).
void append_utf8(std::string& out, char32_t c);

}  // namespace zo::tokenize
