#include "tokenize/tokenizer_spec.h"

#include <filesystem>
#include <sstream>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "core/error.h"

namespace zo::tokenize {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using zo::DataError;

[[noreturn]] void refuse(const std::string& source, const std::string& what) {
  throw DataError("tokenizer '" + source + "': " + what +
                  "; offload_train tokenizes byte-level BPE (GPT-2, Llama 3, Qwen2) only");
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
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() > UINT32_MAX)
      refuse(src, "vocab entry \"" + token + "\" has id " + id.dump() + ", not a 32-bit id");
    spec.vocab.emplace_back(token, id.get<std::uint32_t>());
  }
  if (!m.contains("merges") || !m["merges"].is_array())
    refuse(src, "model has no \"merges\" array");
  std::size_t rank = 0;
  for (const json& merge : m["merges"]) {
    // Two forms: "a b" (older files) or ["a", "b"] (tokenizers >= 0.20).
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        refuse(src, "merge " + std::to_string(rank) + " " + merge.dump() + " is not \"a b\"");
      spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
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
  json vocab;
  try {
    vocab = ckpt::parse_json(ckpt::read_file(enc));
  } catch (const std::exception& e) {
    throw DataError("tokenizer '" + enc.string() + "': " + e.what());
  }
  read_model(spec.source, json{{"vocab", vocab}, {"merges", json::array()}}, spec);
  std::istringstream lines(ckpt::read_file(bpe));
  std::string line;
  std::size_t number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (number == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const auto space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw DataError("'" + bpe.string() + "' line " + std::to_string(number) +
                      ": expected a merge \"a b\"");
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  spec.split_patterns.emplace_back(kGpt2Pattern);
  // GPT-2's end-of-text token sits in encoder.json; it is the special one.
  for (const auto& [token, id] : spec.vocab)
    if (token == "<|endoftext|>") spec.added.push_back({id, token, true});
  return spec;
}

}  // namespace

TokenizerSpec parse_tokenizer_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = ckpt::parse_json(text);
  } catch (const std::exception& e) {
    throw DataError("tokenizer '" + source + "' is not valid JSON: " + e.what());
  }
  if (!j.is_object()) refuse(source, "not a JSON object");
  TokenizerSpec spec;
  spec.source = source;
  read_model(source, j.value("model", json()), spec);
  read_normalizer(source, j.value("normalizer", json()), spec);
  bool byte_level = false;
  const json pre = j.value("pre_tokenizer", json());
  if (!pre.is_null()) read_pre_tokenizer(source, pre, spec, byte_level);
  if (!byte_level)
    refuse(source, "no ByteLevel pre-tokenizer (" + (pre.is_null() ? "none" : pre.dump()) + ")");
  const json dec = j.value("decoder", json());
  if (!dec.is_null() && type_of(dec) != "ByteLevel")
    refuse(source, "decoder of type \"" + type_of(dec) + "\" is not supported (ByteLevel)");
  read_added_tokens(source, j.value("added_tokens", json()), spec);
  return spec;
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
  return parse_tokenizer_json(text, path);
}

}  // namespace zo::tokenize
