#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenize/pre_tokenizer.h"

#include <pcre2.h>

#include <stdexcept>

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
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE at = 0, emitted = 0;
  while (at < text.size()) {
    const int rc = re_->code_->jit ? pcre2_jit_match(re_->code_->code, subject, text.size(), at, 0,
                                                     s_->data, s_->context)
                                   : pcre2_match(re_->code_->code, subject, text.size(), at,
                                                 PCRE2_NO_UTF_CHECK, s_->data, s_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("pre-tokenizer regex failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s_->data);
    const PCRE2_SIZE begin = ov[0], end = ov[1];
    if (begin > emitted) out.push_back(text.substr(emitted, begin - emitted));
    if (end > begin) {
      out.push_back(text.substr(begin, end - begin));
      emitted = at = end;
    } else {  // an empty match: step over one character
      emitted = begin;
      at = begin + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80)
        ++at;
    }
  }
  if (emitted < text.size()) out.push_back(text.substr(emitted));
}

}  // namespace zo::tokenize
