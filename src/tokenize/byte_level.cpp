#include "tokenize/byte_level.h"

#include <array>

namespace zo::tokenize {
namespace {

constexpr bool stands_for_itself(unsigned b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<char32_t, 256> code{};
  std::array<int, 324> byte{};  // code point -> byte (-1: not in the alphabet); all are < 324
  Alphabet() {
    byte.fill(-1);
    char32_t next = 0x100;
    for (unsigned b = 0; b < 256; ++b) {
      code[b] = stands_for_itself(b) ? static_cast<char32_t>(b) : next++;
      byte[code[b]] = static_cast<int>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_code_point(unsigned char b) {
  return alphabet().code[b];
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  append_byte_level(bytes, out);
  return out;
}

void append_byte_level(std::string_view bytes, std::string& out) {
  for (const char ch : bytes)
    append_utf8(out, byte_to_code_point(static_cast<unsigned char>(ch)));
}

std::optional<std::string> from_byte_level(std::string_view text) {
  std::string out;
  if (!append_from_byte_level(text, out)) return std::nullopt;
  return out;
}

bool append_from_byte_level(std::string_view text, std::string& out) {
  // The alphabet lies below U+0800: one or two UTF-8 bytes per character.
  const std::size_t before = out.size();
  const auto refuse = [&] {
    out.resize(before);
    return false;
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto c0 = static_cast<unsigned char>(text[i]);
    char32_t c = 0;
    if (c0 < 0x80) {
      c = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      c = static_cast<char32_t>(((c0 & 0x1F) << 6) |
                                (static_cast<unsigned char>(text[i + 1]) & 0x3F));
      i += 2;
    } else {
      return refuse();
    }
    if (c >= alphabet().byte.size() || alphabet().byte[c] < 0) return refuse();
    out.push_back(static_cast<char>(alphabet().byte[c]));
  }
  return true;
}

}  // namespace zo::tokenize
