// The Split pre-tokenizer: a regex written for Oniguruma (as Hugging Face's tokenizers runs it)
// compiled for PCRE2 in UTF mode with Unicode properties and JIT. Matches and the text between
// them are the pieces ("Isolated" behaviour), in order.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zo::tokenize {

// `\s` and `\S` written as Unicode White_Space (Oniguruma's and Rust's meaning: U+0085 is white
// space, U+180E and U+FEFF are not), so that PCRE2's own list (which holds U+180E) is not used.
// Refuses (std::invalid_argument) `\S` inside a character class.
std::string translate_pattern(std::string_view oniguruma);

class SplitRegex {
 public:
  // std::invalid_argument with PCRE2's message and offset when the pattern does not compile.
  explicit SplitRegex(const std::string& oniguruma_pattern);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Whether a walk may start at the end of any piece of an earlier walk over the same text and
  // give the same pieces from there: true unless the pattern holds \G, \K or a backtracking
  // verb such as (*SKIP), whose matches depend on where the search started.
  bool resumable() const { return resumable_; }

  // Per-thread scratch (match data and JIT stack).
  class Matcher {
   public:
    explicit Matcher(const SplitRegex& re);
    ~Matcher();
    Matcher(Matcher&&) noexcept;
    Matcher& operator=(Matcher&&) = delete;
    Matcher(const Matcher&) = delete;

    // Appends the pieces of `text` (valid UTF-8) to `out`; empty pieces are dropped.
    void split(std::string_view text, std::vector<std::string_view>& out);

    // The same one piece at a time: start() a walk over `text` at byte `from` (0, or a character
    // boundary), then next() until it returns false. A walk started where a piece of another walk
    // ended gives that walk's pieces from there on when the regex is resumable().
    void start(std::string_view text, std::size_t from = 0);
    bool next(std::string_view& piece);

   private:
    const SplitRegex* re_;
    struct Scratch;
    std::unique_ptr<Scratch> s_;
    std::string_view text_;
    std::size_t at_ = 0, emitted_ = 0;  // where the next search starts; the end of the last piece
    std::string_view pending_;          // a match that follows the text before it
  };

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  bool resumable_ = true;
};

}  // namespace zo::tokenize
