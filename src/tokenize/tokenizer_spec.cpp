#include "tokenize/tokenizer_spec.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "core/error.h"
#include "tokenize/bpe_json.h"

namespace zo::tokenize {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using zo::DataError;

[[noreturn]] void refuse(const std::string& source, const std::string& what) {
  throw DataError("tokenizer '" + source + "': " + what +
                  "; offload_train tokenizes byte-level BPE (GPT-2, Llama 3, Qwen2) only");
}

// obj[key], or null when absent (without copying it, as json::value would).
const json& member(const json& obj, const char* key) {
  static const json null;
  const auto it = obj.find(key);
  return it == obj.end() ? null : *it;
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

// A key that must be absent, null or equal to `allowed` (one of its accepted values).
template <class T>
void expect(const std::string& src, const json& obj, const char* key, const T& allowed,
            const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null() || obj[key] == json(allowed)) return;
  refuse(src, where + " \"" + key + "\": " + obj[key].dump() + " is not supported");
}

void read_normalizer(const std::string& src, const json& n, TokenizerSpec& spec) {
  if (n.is_null()) return;
  const std::string type = type_of(n);
  if (type == "NFC") {
    spec.nfc = true;
  } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& each : n["normalizers"])
      read_normalizer(src, each, spec);
  } else {
    refuse(src, "normalizer of type \"" + type + "\" is not supported (only NFC)");
  }
}

// Split (Isolated, a Regex) and ByteLevel, the last one; in a Sequence or alone.
void read_pre_tokenizer(const std::string& src, const json& p, TokenizerSpec& spec,
                        bool& byte_level) {
  const std::string type = type_of(p);
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (const json& each : p["pretokenizers"])
      read_pre_tokenizer(src, each, spec, byte_level);
    return;
  }
  if (byte_level) refuse(src, "a pre-tokenizer after ByteLevel is not supported");
  if (type == "ByteLevel") {
    byte_level = true;
    spec.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) spec.split_patterns.emplace_back(kGpt2Pattern);
    return;
  }
  if (type == "Split") {
    const json& pattern = p.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
      refuse(src, "Split pre-tokenizer without a \"Regex\" pattern is not supported");
    expect(src, p, "behavior", "Isolated", "Split");
    expect(src, p, "invert", false, "Split");
    spec.split_patterns.push_back(pattern["Regex"].get<std::string>());
    return;
  }
  refuse(src, "pre-tokenizer of type \"" + type + "\" is not supported (Split, ByteLevel)");
}

void read_model(const std::string& src, const json& m, TokenizerSpec& spec) {
  if (!m.is_object()) refuse(src, "no \"model\" object");
  if (m.contains("type") && type_of(m) != "BPE")
    refuse(src, "model of type \"" + type_of(m) + "\" is not supported (only BPE)");
  expect(src, m, "dropout", 0.0, "BPE");
  expect(src, m, "continuing_subword_prefix", "", "BPE");
  expect(src, m, "end_of_word_suffix", "", "BPE");
  expect(src, m, "byte_fallback", false, "BPE");
  spec.ignore_merges = m.value("ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) refuse(src, "model has no \"vocab\" object");
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() >= UINT32_MAX)
      refuse(src, "vocab entry \"" + token + "\" has id " + id.dump() + ", not a 32-bit id");
    if (!spec.vocab.add(spec.strings->keep(token), id.get<std::uint32_t>()))
      refuse(src, "vocab holds \"" + token + "\" twice");
  }
  if (!m.contains("merges") || !m["merges"].is_array())
    refuse(src, "model has no \"merges\" array");
  std::size_t rank = 0;
  for (const json& merge : m["merges"]) {
    // Two forms: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20).
    if (merge.is_string()) {
      const std::string_view s = spec.strings->keep(merge.get<std::string>());
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        refuse(src, "merge " + std::to_string(rank) + " " + merge.dump() + " is not \"a b\"");
      spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec.merges.emplace_back(spec.strings->keep(merge[0].get<std::string>()),
                               spec.strings->keep(merge[1].get<std::string>()));
    } else {
      refuse(src, "merge " + std::to_string(rank) + " " + merge.dump() + " is not a pair");
    }
    ++rank;
  }
}

void read_added_tokens(const std::string& src, const json& added, TokenizerSpec& spec) {
  if (added.is_null()) return;
  if (!added.is_array()) refuse(src, "\"added_tokens\" is not an array");
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() ||
        !a.contains("content") || !a["content"].is_string())
      refuse(src, "added token " + a.dump() + " lacks an id or content");
    if (a["id"].get<std::uint64_t>() >= UINT32_MAX)
      refuse(src, "added token " + a.dump() + " has an id above every 32-bit vocabulary");
    AddedToken t{a["id"].get<std::uint32_t>(), a["content"].get<std::string>(),
                 a.value("special", false)};
    if (!t.special) {  // special ones are never matched in text, so their flags change nothing
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        expect(src, a, flag, false, "added token " + json(t.content).dump());
    }
    if (t.content.empty()) refuse(src, "an added token has empty content");
    spec.added.push_back(std::move(t));
  }
}

TokenizerSpec read_gpt2_files(const fs::path& dir) {
  TokenizerSpec spec;
  const fs::path enc = dir / "encoder.json", bpe = dir / "vocab.bpe";
  spec.source = enc.string() + " + " + bpe.string();
  SpecStrings& strings = *spec.strings;
  std::optional<json> tree;  // the general reader's, when the direct one does not take the file
  try {
    strings.text = ckpt::read_file(enc);
    if (auto vocab = read_vocab_json(strings.text, strings)) {
      spec.vocab = std::move(*vocab);
    } else {
      strings.owned.clear();
      tree = ckpt::parse_json(strings.text);
    }
  } catch (const std::exception& e) {
    throw DataError("tokenizer '" + enc.string() + "': " + e.what());
  }
  if (tree)
    read_model(spec.source, json{{"vocab", std::move(*tree)}, {"merges", json::array()}}, spec);
  const std::string_view lines = strings.keep(ckpt::read_file(bpe));
  std::size_t number = 0;
  for (std::size_t at = 0; at < lines.size();) {
    const std::size_t end = std::min(lines.find('\n', at), lines.size());
    const std::string_view line = lines.substr(at, end - at);
    at = end + 1;
    ++number;
    if (number == 1 && line.starts_with("#version")) continue;
    if (line.empty()) continue;
    const auto space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw DataError("'" + bpe.string() + "' line " + std::to_string(number) +
                      ": expected a merge \"a b\"");
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  spec.split_patterns.emplace_back(kGpt2Pattern);
  // GPT-2's end-of-text token sits in encoder.json; it is the special one.
  if (const auto id = spec.vocab.find("<|endoftext|>"))
    spec.added.push_back({*id, "<|endoftext|>", true});
  return spec;
}

// Everything but the JSON parsing; `j` may hold the vocabulary and merges or, read directly, stand
// in {} and [] for them.
TokenizerSpec read_spec(const json& j, const std::string& source,
                        std::shared_ptr<SpecStrings> strings) {
  if (!j.is_object()) refuse(source, "not a JSON object");
  TokenizerSpec spec;
  spec.source = source;
  spec.strings = std::move(strings);
  read_model(source, member(j, "model"), spec);
  read_normalizer(source, member(j, "normalizer"), spec);
  bool byte_level = false;
  const json& pre = member(j, "pre_tokenizer");
  if (!pre.is_null()) read_pre_tokenizer(source, pre, spec, byte_level);
  if (!byte_level)
    refuse(source, "no ByteLevel pre-tokenizer (" + (pre.is_null() ? "none" : pre.dump()) + ")");
  const json& dec = member(j, "decoder");
  if (!dec.is_null() && type_of(dec) != "ByteLevel")
    refuse(source, "decoder of type \"" + type_of(dec) + "\" is not supported (ByteLevel)");
  read_added_tokens(source, member(j, "added_tokens"), spec);
  return spec;
}

// The fast way (bpe_json.h), or nothing when the file needs the general one.
std::optional<TokenizerSpec> read_direct(const std::shared_ptr<SpecStrings>& strings,
                                         const std::string& source) {
  auto bpe = read_bpe_json(strings->text, *strings);
  if (!bpe) return std::nullopt;
  try {
    TokenizerSpec spec = read_spec(ckpt::parse_json(bpe->rest), source, strings);
    spec.vocab = std::move(bpe->vocab);
    spec.merges = std::move(bpe->merges);
    return spec;
  } catch (const std::exception&) {  // the general reader says what it is
    return std::nullopt;
  }
}

}  // namespace

TokenizerSpec parse_tokenizer_json(std::string text, const std::string& source, bool direct) {
  auto strings = std::make_shared<SpecStrings>();
  strings->text = std::move(text);
  if (direct) {
    if (auto spec = read_direct(strings, source)) return std::move(*spec);
    strings->owned.clear();
  }
  json j;
  try {
    j = ckpt::parse_json(strings->text);
  } catch (const std::exception& e) {
    throw DataError("tokenizer '" + source + "' is not valid JSON: " + e.what());
  }
  return read_spec(j, source, std::move(strings));
}

TokenizerSpec load_tokenizer_spec(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "tokenizer.json"))
      return load_tokenizer_spec((p / "tokenizer.json").string());
    if (fs::exists(p / "encoder.json") && fs::exists(p / "vocab.bpe")) return read_gpt2_files(p);
    throw DataError("tokenizer directory '" + path +
                    "' holds neither tokenizer.json nor GPT-2's encoder.json + vocab.bpe");
  }
  std::string text;
  try {
    text = ckpt::read_file(p);
  } catch (const std::exception& e) {
    throw DataError(std::string("cannot read tokenizer: ") + e.what());
  }
  return parse_tokenizer_json(std::move(text), path);
}

}  // namespace zo::tokenize
