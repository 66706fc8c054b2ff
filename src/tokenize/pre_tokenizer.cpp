#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenize/pre_tokenizer.h"

#include <pcre2.h>

#include <stdexcept>

#include "core/error.h"

namespace zo::tokenize {
namespace {

// Unicode White_Space (PropList.txt), as class members.
constexpr std::string_view kWhiteSpace =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class) throw std::invalid_argument("\\S inside a character class is not supported");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    if (c == '[' && in_class && i + 1 < p.size() && (p[i + 1] == ':' || p[i + 1] == '['))
      throw std::invalid_argument("nested classes or POSIX classes are not supported");
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

SplitRegex::SplitRegex(const std::string& oniguruma_pattern) : code_(std::make_unique<Code>()) {
  const std::string pattern = translate_pattern(oniguruma_pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code_->code) {
    throw std::invalid_argument("regex " + oniguruma_pattern + " does not compile (as " + pattern +
                                "): " + pcre2_message(err) + " at offset " +
                                std::to_string(offset));
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
  for (const char* start_dependent : {"\\G", "\\K", "(*"})  // (*: (*SKIP) and other verbs
    resumable_ = resumable_ && pattern.find(start_dependent) == std::string::npos;
}

SplitRegex::~SplitRegex() = default;

struct SplitRegex::Matcher::Scratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~Scratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

SplitRegex::Matcher::Matcher(const SplitRegex& re) : re_(&re), s_(std::make_unique<Scratch>()) {
  s_->data = pcre2_match_data_create_from_pattern(re.code_->code, nullptr);
  s_->context = pcre2_match_context_create(nullptr);
  // Long runs (a megabyte of spaces) backtrack deeply in `\s+(?!\S)`; the default 32 KiB JIT
  // stack would fail on them.
  s_->stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  if (!s_->data || !s_->context || !s_->stack) throw std::bad_alloc();
  pcre2_jit_stack_assign(s_->context, nullptr, s_->stack);
}

SplitRegex::Matcher::~Matcher() = default;
SplitRegex::Matcher::Matcher(Matcher&&) noexcept = default;

void SplitRegex::Matcher::split(std::string_view text, std::vector<std::string_view>& out) {
  start(text);
  for (std::string_view piece; next(piece);)
    out.push_back(piece);
}

void SplitRegex::Matcher::start(std::string_view text, std::size_t from) {
  text_ = text;
  at_ = emitted_ = from;
  pending_ = {};
}

// Matches and the text between them, in order (Isolated); an empty match steps over one
// character and emits nothing.
bool SplitRegex::Matcher::next(std::string_view& piece) {
  if (!pending_.empty()) {
    piece = pending_;
    pending_ = {};
    return true;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text_.data());
  while (at_ < text_.size()) {
    const int rc = re_->code_->jit ? pcre2_jit_match(re_->code_->code, subject, text_.size(), at_,
                                                     0, s_->data, s_->context)
                                   : pcre2_match(re_->code_->code, subject, text_.size(), at_,
                                                 PCRE2_NO_UTF_CHECK, s_->data, s_->context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      at_ = text_.size();
      break;
    }
    if (rc < 0) {
      throw DataError("the pre-tokenizer's regex failed on this text (" + pcre2_message(rc) +
                      "): its pattern backtracks too much here; check the tokenizer's Split "
                      "pattern");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s_->data);
    const PCRE2_SIZE begin = ov[0], end = ov[1];
    const std::string_view before = text_.substr(emitted_, begin - emitted_);
    if (end > begin) {
      emitted_ = at_ = end;
      const std::string_view match = text_.substr(begin, end - begin);
      if (before.empty()) {
        piece = match;
      } else {
        piece = before;
        pending_ = match;
      }
      return true;
    }
    emitted_ = begin;  // an empty match: step over one character
    at_ = begin + 1;
    while (at_ < text_.size() && (static_cast<unsigned char>(text_[at_]) & 0xC0) == 0x80)
      ++at_;
    if (!before.empty()) {
      piece = before;
      return true;
    }
  }
  if (emitted_ < text_.size()) {
    piece = text_.substr(emitted_);
    emitted_ = text_.size();
    return true;
  }
  return false;
}

}  // namespace zo::tokenize
