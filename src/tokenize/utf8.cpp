#include "tokenize/utf8.h"

#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace zo::tokenize {
namespace {

// The length of the well-formed character starting at s[i] (Unicode Table 3-7), 0 when there is
// none, -1 when s ends inside what is so far a valid prefix of one.
int char_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const unsigned char d = b(k);
    if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
  }
  return n;
}

// Every code point below U+0300 is NFC as it stands and composes with nothing before it
// (Unicode's NFC_Quick_Check is Yes and the combining class 0 for all of them), and in UTF-8
// exactly those are written with lead bytes below 0xCC.
bool below_u0300(std::string_view s) {
  for (const char c : s)
    if (static_cast<unsigned char>(c) >= 0xCC) return false;
  return true;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

std::size_t first_invalid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    if (i + 8 <= s.size()) {  // ASCII runs a word at a time
      std::uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    const int n = char_length(s, i);
    if (n <= 0) return i;
    i += static_cast<std::size_t>(n);
  }
  return kValidUtf8;
}

std::string to_nfc(std::string_view s) {
  if (below_u0300(s)) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw std::runtime_error(std::string("NFC: ") + utf8proc_errmsg(n));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> own(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  std::size_t i = 0;
  while (i < pending_.size()) {
    const int n = char_length(pending_, i);
    if (n < 0) break;  // wait for the rest of the character
    if (n == 0) {
      out.append(kReplacement);
      ++i;
      continue;
    }
    out.append(pending_, i, static_cast<std::size_t>(n));
    i += static_cast<std::size_t>(n);
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out;
  if (!pending_.empty()) out.append(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace zo::tokenize
