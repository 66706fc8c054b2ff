#include "tokenize/bpe_json.h"

#include <algorithm>
#include <cstdint>

#include "tokenize/byte_level.h"
#include "tokenize/utf8.h"

namespace zo::tokenize {
namespace {

constexpr int kMaxDepth = 64;  // as the general reader (ckpt::kMaxJsonDepth)
constexpr std::size_t kNone = std::string_view::npos;
// JSON's one-letter escapes, each followed by the character it stands for.
constexpr std::string_view kEscapes = "\"\"\\\\//b\bf\fn\nr\rt\t";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A cursor over JSON text; each reading method returns false at anything it does not expect.
class Scanner {
 public:
  Scanner(std::string_view text, SpecStrings& strings) : t_(text), strings_(strings) {}

  std::size_t pos() {
    ws();
    return i_;
  }
  bool at_end() { return pos() == t_.size(); }
  bool eat(char c) {
    if (pos() < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool next_is(char c) { return pos() < t_.size() && t_[i_] == c; }

  // A view into the text, or the unescaped string kept in `strings`.
  bool string(std::string_view& out) {
    if (!eat('"')) return false;
    const std::size_t begin = i_;
    bool high = false;
    for (; i_ < t_.size(); ++i_) {
      const auto c = static_cast<unsigned char>(t_[i_]);
      if (c == '"') {
        out = t_.substr(begin, i_ - begin);
        ++i_;
        return !high || first_invalid_utf8(out) == kValidUtf8;
      }
      if (c == '\\') return escaped(begin, out);
      if (c < 0x20) return false;
      high = high || c >= 0x80;
    }
    return false;
  }

  // An unsigned integer below UINT32_MAX, as JSON writes one (no sign, fraction or exponent).
  bool id(std::uint32_t& out) {
    const std::size_t begin = pos();
    std::uint64_t v = 0;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9' && i_ - begin < 11)
      v = 10 * v + static_cast<std::uint64_t>(t_[i_++] - '0');
    const std::size_t digits = i_ - begin;
    if (digits == 0 || (digits > 1 && t_[begin] == '0') || v >= UINT32_MAX) return false;
    if (i_ < t_.size() &&
        (t_[i_] == '.' || t_[i_] == 'e' || t_[i_] == 'E' || (t_[i_] >= '0' && t_[i_] <= '9')))
      return false;
    out = static_cast<std::uint32_t>(v);
    return true;
  }

  // Any value, checked only for where it ends: what is not the vocabulary or the merges goes to
  // the general reader, which checks it.
  bool skip_value(int depth) {
    if (pos() >= t_.size()) return false;
    const char c = t_[i_];
    if (c == '"') return skip_string();
    if (c == '{' || c == '[') {
      if (depth >= kMaxDepth) return false;
      const char close = c == '{' ? '}' : ']';
      ++i_;
      if (eat(close)) return true;
      do {
        if (c == '{' && !(skip_string() && eat(':'))) return false;
        if (!skip_value(depth + 1)) return false;
      } while (eat(','));
      return eat(close);
    }
    const std::size_t begin = i_;
    while (i_ < t_.size() && !is_space(t_[i_]) && t_[i_] != ',' && t_[i_] != '}' && t_[i_] != ']')
      ++i_;
    return i_ > begin;
  }

  // {"token": id, ...}
  bool vocab(Vocab& v) {
    if (!eat('{')) return false;
    if (eat('}')) return true;
    do {
      std::string_view token;
      std::uint32_t id = 0;
      if (!string(token) || !eat(':') || !this->id(id) || !v.add(token, id)) return false;
    } while (eat(','));
    return eat('}');
  }

  // ["a b", ...] or [["a", "b"], ...]
  bool merges(std::vector<std::pair<std::string_view, std::string_view>>& out) {
    if (!eat('[')) return false;
    if (eat(']')) return true;
    do {
      std::string_view l, r;
      if (next_is('"')) {
        std::string_view m;
        if (!string(m)) return false;
        const auto space = m.find(' ');
        if (space == kNone || m.find(' ', space + 1) != kNone) return false;
        l = m.substr(0, space);
        r = m.substr(space + 1);
      } else if (!(eat('[') && string(l) && eat(',') && string(r) && eat(']'))) {
        return false;
      }
      out.emplace_back(l, r);
    } while (eat(','));
    return eat(']');
  }

 private:
  void ws() {
    while (i_ < t_.size() && is_space(t_[i_]))
      ++i_;
  }

  bool skip_string() {
    if (!eat('"')) return false;
    for (; i_ < t_.size(); ++i_) {
      if (t_[i_] == '\\') {
        ++i_;
      } else if (t_[i_] == '"') {
        ++i_;
        return true;
      }
    }
    return false;
  }

  // The rest of a string from its first backslash (at i_); `begin` is just after the quote.
  bool escaped(std::size_t begin, std::string_view& out) {
    std::string s(t_.substr(begin, i_ - begin));
    while (i_ < t_.size()) {
      const auto c = static_cast<unsigned char>(t_[i_++]);
      if (c == '"') {
        if (first_invalid_utf8(s) != kValidUtf8) return false;
        out = strings_.keep(std::move(s));
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') {
        s.push_back(static_cast<char>(c));
        continue;
      }
      if (i_ >= t_.size()) return false;
      const char e = t_[i_++];
      if (e != 'u') {
        const auto k = kEscapes.find(e);
        if (k == std::string_view::npos || k % 2 != 0) return false;
        s.push_back(kEscapes[k + 1]);
        continue;
      }
      char32_t cp = 0;
      if (!hex4(cp) || (cp >= 0xDC00 && cp <= 0xDFFF)) return false;  // a lone low surrogate
      if (cp >= 0xD800 && cp <= 0xDBFF) {  // must be followed by its low surrogate
        char32_t low = 0;
        if (i_ + 2 > t_.size() || t_[i_] != '\\' || t_[i_ + 1] != 'u') return false;
        i_ += 2;
        if (!hex4(low) || low < 0xDC00 || low > 0xDFFF) return false;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
      }
      append_utf8(s, cp);
    }
    return false;
  }

  bool hex4(char32_t& cp) {
    if (i_ + 4 > t_.size()) return false;
    for (int k = 0; k < 4; ++k) {
      const int d = hex_digit(t_[i_++]);
      if (d < 0) return false;
      cp = cp << 4 | static_cast<char32_t>(d);
    }
    return true;
  }

  std::string_view t_;
  SpecStrings& strings_;
  std::size_t i_ = 0;
};

}  // namespace

std::optional<BpeJson> read_bpe_json(std::string_view text, SpecStrings& strings) {
  Scanner s(text, strings);
  BpeJson out;
  std::size_t vocab[2] = {kNone, kNone}, merges[2] = {kNone, kNone};  // where each value lies
  bool model = false;
  if (!s.eat('{') || s.eat('}')) return std::nullopt;
  do {
    std::string_view key;
    if (!s.string(key) || !s.eat(':')) return std::nullopt;
    if (key != "model") {
      if (!s.skip_value(1)) return std::nullopt;
      continue;
    }
    if (model || !s.eat('{') || s.eat('}')) return std::nullopt;
    model = true;
    do {
      if (!s.string(key) || !s.eat(':')) return std::nullopt;
      if (key == "vocab") {
        if (vocab[0] != kNone) return std::nullopt;  // twice: the general reader refuses it
        vocab[0] = s.pos();
        if (!s.vocab(out.vocab)) return std::nullopt;
        vocab[1] = s.pos();
      } else if (key == "merges") {
        if (merges[0] != kNone) return std::nullopt;
        merges[0] = s.pos();
        if (!s.merges(out.merges)) return std::nullopt;
        merges[1] = s.pos();
      } else if (!s.skip_value(2)) {
        return std::nullopt;
      }
    } while (s.eat(','));
    if (!s.eat('}')) return std::nullopt;
  } while (s.eat(','));
  if (!s.eat('}') || !s.at_end() || vocab[0] == kNone || merges[0] == kNone) return std::nullopt;
  const std::size_t* first = vocab[0] < merges[0] ? vocab : merges;
  const std::size_t* second = first == vocab ? merges : vocab;
  const auto empty = [&](const std::size_t* span) { return span == vocab ? "{}" : "[]"; };
  out.rest.reserve(text.size() - (first[1] - first[0]) - (second[1] - second[0]) + 4);
  out.rest.append(text.substr(0, first[0]))
      .append(empty(first))
      .append(text.substr(first[1], second[0] - first[1]))
      .append(empty(second))
      .append(text.substr(second[1]));
  return out;
}

std::optional<Vocab> read_vocab_json(std::string_view text, SpecStrings& strings) {
  Scanner s(text, strings);
  Vocab v;
  if (!s.vocab(v) || !s.at_end()) return std::nullopt;
  return v;
}

}  // namespace zo::tokenize
