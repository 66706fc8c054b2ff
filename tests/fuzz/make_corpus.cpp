// Writes the seed corpus of every fuzz target into <out>/<target>/ (tests/fuzz/corpus/ is its
// output, committed): small valid files made by the project's own writers, matching the fixtures
// the targets read (fixtures.h), plus a few near-valid ones. Deterministic: rerunning it after a
// format change only changes what the change changed.
//   fuzz_make_corpus tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/atomic_io.h"
#include "checkpoint/safetensors.h"
#include "data/shard.h"
#include "fixtures.h"
#include "fuzz_common.h"
#include "model/hf_weights.h"
#include "model/layout.h"
#include "tokenize/byte_level.h"

namespace fs = std::filesystem;
using nlohmann::json;
using zo::fuzz::write_file;

namespace {

fs::path g_out;

fs::path seed(const std::string& target, const std::string& name) {
  fs::create_directories(g_out / target);
  return g_out / target / name;
}

// A safetensors file written byte by byte, for what the writer does not produce (other dtypes,
// scalars, empty tensors, a "transformer." prefix).
std::string safetensors_bytes(const json& header, const std::string& data) {
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[std::size_t(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

std::string shard_bytes(const std::vector<std::uint16_t>& tokens, std::int32_t count) {
  std::string out(zo::data::kShardHeaderBytes, '\0');
  const std::int32_t head[3] = {zo::data::kShardMagic, zo::data::kShardVersion, count};
  for (int i = 0; i < 12; ++i)
    out[std::size_t(i)] = static_cast<char>((head[i / 4] >> (8 * (i % 4))) & 0xff);
  for (const std::uint16_t t : tokens) {
    out += static_cast<char>(t & 0xff);
    out += static_cast<char>(t >> 8);
  }
  return out;
}

void model_spec() {
  const auto put = [](const std::string& name, const json& j) {
    write_file(seed("model_spec", name), j.dump(2) + "\n");
  };
  put("tiny.json", zo::model::load_model_spec("tiny").to_json());
  put("micro.json", zo::fuzz::micro_spec().to_json());
  put("tiny_llama.json", zo::model::load_model_spec("tiny-llama").to_json());
  put("tiny_qwen2.json", zo::model::load_model_spec("tiny-qwen2").to_json());
  put("llama3.1_8b.json", zo::model::load_model_spec("llama3.1-8b").to_json());
  // Hugging Face's gpt2 config.json (the keys that matter and the ones ignored).
  put("hf_gpt2_config.json",
      {{"activation_function", "gelu_new"},
       {"architectures", {"GPT2LMHeadModel"}},
       {"attn_pdrop", 0.1},
       {"bos_token_id", 50256},
       {"embd_pdrop", 0.1},
       {"eos_token_id", 50256},
       {"initializer_range", 0.02},
       {"layer_norm_epsilon", 1e-05},
       {"model_type", "gpt2"},
       {"n_ctx", 1024},
       {"n_embd", 768},
       {"n_head", 12},
       {"n_layer", 12},
       {"n_positions", 1024},
       {"resid_pdrop", 0.1},
       {"summary_activation", nullptr},
       {"summary_first_dropout", 0.1},
       {"summary_proj_to_labels", true},
       {"summary_type", "cls_index"},
       {"summary_use_proj", true},
       {"task_specific_params", {{"text-generation", {{"do_sample", true}, {"max_length", 50}}}}},
       {"vocab_size", 50257}});
  put("both_block_size_and_n_positions.json", {{"n_layer", 2},
                                               {"n_head", 2},
                                               {"n_embd", 64},
                                               {"vocab_size", 256},
                                               {"block_size", 64},
                                               {"n_positions", 64}});
  put("not_divisible.json",
      {{"n_layer", 2}, {"n_head", 3}, {"n_embd", 64}, {"vocab_size", 256}, {"block_size", 64}});
  // Fuzzing found these (regress_*: kept as seeds so that CI runs them every time). A parameter
  // count past 2^64 that wrapped around, and 2^30 layers laid out for minutes.
  put("regress_count_wraps.json", {{"n_layer", 4096},
                                   {"n_head", 1},
                                   {"n_embd", 1 << 30},
                                   {"vocab_size", 8},
                                   {"block_size", 4}});
  put("regress_n_layer_huge.json",
      {{"n_layer", 1 << 30}, {"n_head", 1}, {"n_embd", 4}, {"vocab_size", 8}, {"block_size", 4}});
}

void safetensors(const zo::fuzz::CheckpointFixture&, const fs::path& ckpt) {
  const zo::model::ParameterLayout layout(zo::fuzz::micro_spec());
  std::vector<float> params(layout.size());
  zo::model::init_weights(layout, 3, params.data());
  const zo::model::HfSource source = zo::model::hf_source(params);
  zo::model::export_hf_weights(seed("safetensors", "micro_f32.safetensors"), layout, source,
                               zo::DType::kF32);
  zo::model::export_hf_weights(seed("safetensors", "micro_bf16.safetensors"), layout, source,
                               zo::DType::kBF16);
  fs::copy_file(ckpt / "optimizer.rank1-of2.safetensors",
                seed("safetensors", "optimizer_shard.safetensors"),
                fs::copy_options::overwrite_existing);
  // Every kind of entry the reader accepts: metadata, an unconvertible dtype, a scalar, an empty
  // tensor, 4-bit elements, a prefixed GPT-2 name and an ignored HF buffer.
  const json header = {
      {"__metadata__", {{"format", "pt"}}},
      {"transformer.ln_f.bias", {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {0, 8}}}},
      {"i64", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {8, 16}}}},
      {"scalar", {{"dtype", "BF16"}, {"shape", json::array()}, {"data_offsets", {16, 18}}}},
      {"empty", {{"dtype", "F32"}, {"shape", {0, 3}}, {"data_offsets", {18, 18}}}},
      {"f4", {{"dtype", "F4"}, {"shape", {2, 2}}, {"data_offsets", {18, 20}}}},
      {"h.0.attn.bias", {{"dtype", "U8"}, {"shape", {2}}, {"data_offsets", {20, 22}}}}};
  std::string data;
  for (int i = 0; i < 22; ++i)
    data += static_cast<char>(0x3c + i);
  write_file(seed("safetensors", "mixed.safetensors"), safetensors_bytes(header, data));
  write_file(seed("safetensors", "empty.safetensors"), safetensors_bytes(json::object(), ""));
}

void shard(const fs::path& shards) {
  fs::copy_file(shards / "a.bin", seed("shard", "a.bin"), fs::copy_options::overwrite_existing);
  std::vector<std::uint16_t> t(40);
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::uint16_t>(i * 11);  // some >= the target's vocab_size 300
  write_file(seed("shard", "out_of_vocab.bin"), shard_bytes(t, 40));
  write_file(seed("shard", "too_short_for_a_window.bin"), shard_bytes({1, 2, 3}, 3));
  write_file(seed("shard", "count_too_large.bin"), shard_bytes({1, 2, 3, 4}, 5));
  // llm.c's Llama 3 format (uint32 tokens), some above the target's vocabulary.
  std::vector<std::uint32_t> wide(40);
  for (std::size_t i = 0; i < wide.size(); ++i)
    wide[i] = static_cast<std::uint32_t>(i * 13);
  zo::data::write_token_shard(seed("shard", "uint32.bin").string(), wide);
}

void manifest() {
  const fs::path work = g_out / ".manifest.work";
  fs::remove_all(work);
  zo::ckpt::AtomicDirectory dir(work / "ckpt");
  for (const auto& [name, text] : zo::fuzz::manifest_fixture_files())
    dir.write_file(name, text);
  dir.commit();
  const std::string text = zo::ckpt::read_file(work / "ckpt" / zo::ckpt::kManifestName);
  write_file(seed("manifest", "MANIFEST.json"), text);
  // Version 1 (before the manifest's own checksum): a change to it reaches the entries' checks.
  json j = json::parse(text);
  j.erase("manifest_crc32c");
  j["version"] = 1;
  write_file(seed("manifest", "legacy_v1.json"), j.dump(2) + "\n");
  j["files"][0]["crc32c"] = "00000000";
  j["files"][1]["size"] = 1;
  write_file(seed("manifest", "legacy_v1_corrupted.json"), j.dump(2) + "\n");
  fs::remove_all(work);
}

void loader_state(const fs::path& shards) {
  const auto put = [](const std::string& name, const json& j) {
    write_file(seed("loader_state", name), j.dump(2) + "\n");
  };
  auto loader = zo::fuzz::shard_loader(shards);
  std::vector<std::int32_t> in, tgt;
  put("shards_start.json", loader->state());
  for (int i = 0; i < 13; ++i)  // into the second epoch
    loader->next_batch(in, tgt);
  put("shards_epoch1.json", loader->state());
  auto synthetic = zo::fuzz::synthetic_loader();
  for (int i = 0; i < 3; ++i)
    synthetic->next_batch(in, tgt);
  put("synthetic.json", synthetic->state());
  // Fuzzing found these: a file entry without "tokens" (read through a missing key), a cursor
  // and a batch size out of their types' range (undefined conversions and overflow).
  json j = loader->state();
  j["data"]["files"][0].erase("tokens");
  j["data"]["files"][0]["hash"] = "0";
  put("regress_file_without_tokens.json", j);
  j = loader->state();
  j["batches_served"] = 1e30;
  put("regress_cursor_float.json", j);
  j = loader->state();
  j["config"]["batch_size"] = std::numeric_limits<std::int64_t>::max();
  j["config"]["world_size"] = 2;
  put("regress_global_batch_overflow.json", j);
}

void trainer_state(const zo::fuzz::CheckpointFixture& fx) {
  write_file(seed("trainer_state", "whole.json"), fx.whole_state);
  write_file(seed("trainer_state", "sharded.json"), fx.sharded_state);
  json j = json::parse(fx.whole_state);
  j["model_spec"] = zo::model::load_model_spec("tiny").to_json();
  write_file(seed("trainer_state", "other_model.json"), j.dump(2));
  // Found with this target: a step out of int64's range (an undefined conversion), and shard
  // ranges that overlap where their sizes match the files, leaving moments unset.
  j = json::parse(fx.whole_state);
  j["step"] = 1e300;
  write_file(seed("trainer_state", "regress_step_float.json"), j.dump(2));
  j = json::parse(fx.sharded_state);
  j["optimizer_shards"]["files"][1]["ranges"] = {{100, 150}, {100, 150}};
  write_file(seed("trainer_state", "regress_shards_overlap.json"), j.dump(2));
}

void hf_index(const fs::path& dir) {
  const std::string text = zo::fuzz::make_hf_index_fixture(dir);
  write_file(seed("hf_index", "index.json"), text);
  json j = json::parse(text);
  json& map = j["weight_map"];
  const std::string first = map["wte.weight"], last = map["ln_f.bias"];
  map["wte.weight"] = last;  // in a shard that lacks it
  write_file(seed("hf_index", "wrong_shard.json"), j.dump(2));
  j = json::parse(text);
  j["weight_map"].erase("wpe.weight");
  write_file(seed("hf_index", "unlisted_tensor.json"), j.dump(2));
  j = json::parse(text);
  j["weight_map"]["wte.weight"] = "../" + first;
  write_file(seed("hf_index", "traversal.json"), j.dump(2));
  j = json::parse(text);
  j["weight_map"]["lm_head.weight"] = first;
  j["metadata"] = 1;
  write_file(seed("hf_index", "bad_metadata.json"), j.dump(2));
}

}  // namespace

// Byte-level BPE tokenizer.json files: GPT-2's kind (ByteLevel with its regex) with a few
// merges and a special token, Qwen2's (NFC, a Split regex, then ByteLevel without one), and Llama
// 3's (merges as pairs, ignore_merges, its Split regex; every non-ASCII character written as a
// \u escape, so that the direct reader of vocab and merges unescapes them).
void tokenizer() {
  json vocab = json::object(), merges = json::array();
  for (int b = 0; b < 256; ++b)
    vocab[zo::tokenize::to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  for (const auto& [l, r] : std::vector<std::pair<std::string, std::string>>{
           {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}}) {
    if (!vocab.contains(l + r)) vocab[l + r] = next++;  // \xC4\xA0: the byte-level space
    merges.push_back(l + " " + r);
  }
  const json added = json::array({{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}}});
  json gpt2 = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
      {"added_tokens", added}};
  write_file(seed("tokenizer", "gpt2_kind.json"), gpt2.dump(1) + "\n");
  json qwen = gpt2;
  qwen["normalizer"] = {{"type", "NFC"}};
  qwen["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"},
             {"pattern",
              {{"Regex", "(?i:'s|'t)|\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  write_file(seed("tokenizer", "qwen2_kind.json"), qwen.dump(1) + "\n");
  json llama = gpt2;
  llama["model"]["ignore_merges"] = true;
  llama["model"]["merges"] = json::array();
  for (const json& m : merges) {
    const std::string s = m.get<std::string>();
    llama["model"]["merges"].push_back(
        json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)}));
  }
  llama["added_tokens"] =
      json::array({{{"id", next}, {"content", "<|begin_of_text|>"}, {"special", true}}});
  llama["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern",
                      {{"Regex",
                        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  write_file(seed("tokenizer", "llama3_kind.json"), llama.dump(1, ' ', true) + "\n");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  const fs::path work = zo::fuzz::scratch_dir();
  const fs::path shards = zo::fuzz::make_shard_fixture(work / "shards");
  const fs::path ckpt = work / "step_00000003";
  const zo::fuzz::CheckpointFixture fx = zo::fuzz::make_checkpoint_fixture(ckpt);
  model_spec();
  safetensors(fx, ckpt);
  shard(shards);
  manifest();
  loader_state(shards);
  trainer_state(fx);
  hf_index(work / "hf");
  tokenizer();
  std::printf("seed corpus written to %s\n", g_out.c_str());
  return 0;
}
