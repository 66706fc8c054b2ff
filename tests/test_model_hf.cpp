// Hugging Face weights in and out: model directories with config.json and sharded safetensors
// (export_hf_directory), sharded sets read through their index (import_hf_weights), for GPT-2 and
// the Llama family. Files are checked against safetensors written by hand here (an independent
// reference) and against the project's own writer; every refusal names its problem.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_set.h"
#include "input_test.h"
#include "model/hf_weights.h"
#include "model/layout.h"
#include "model/spec.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using zo::DType;
using zo::model::ParameterLayout;
using zo::test::error_of;
using zo::test::Scratch;

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> random_params(const ParameterLayout& layout, std::uint64_t seed) {
  std::vector<float> p(layout.size());
  zo::model::init_weights(layout, seed, p.data());
  // Norm weights are all 1 and biases 0 after init: make every tensor distinct.
  for (std::size_t i = 0; i < p.size(); ++i)
    p[i] += 1e-3f * static_cast<float>(i % 101);
  return p;
}

json read_json(const fs::path& p) {
  return json::parse(bytes_of(p));
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

// A micro GPT-2 and a micro Llama (untied, GQA, q/k/v biases as Qwen2): a few KiB of weights.
zo::model::ModelSpec micro_gpt2() {
  return zo::model::model_spec_from_json(
      {{"n_layer", 1}, {"n_head", 1}, {"n_embd", 4}, {"vocab_size", 8}, {"block_size", 4}},
      "micro");
}

zo::model::ModelSpec micro_qwen2(bool tied) {
  return zo::model::model_spec_from_json({{"model_type", "qwen2"},
                                          {"num_hidden_layers", 1},
                                          {"hidden_size", 8},
                                          {"num_attention_heads", 2},
                                          {"num_key_value_heads", 1},
                                          {"intermediate_size", 12},
                                          {"vocab_size", 16},
                                          {"max_position_embeddings", 32},
                                          {"tie_word_embeddings", tied}},
                                         "micro-qwen2");
}

// ---- a safetensors writer of its own, the independent reference -------------------------------

struct HandTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16"
  std::vector<std::uint64_t> shape;
  std::vector<float> values;  // exactly representable in dtype
};

// IEEE half bits of a value that is exactly representable as a normal half (or zero).
std::uint16_t half_of(float v) {
  if (v == 0.0f) return std::signbit(v) ? 0x8000 : 0;
  int e = 0;
  const float m = std::frexp(std::fabs(v), &e);  // |v| = m 2^e, m in [0.5, 1)
  const auto frac = static_cast<std::uint16_t>(std::ldexp(m, 11) - 1024.0f);  // 10 bits
  return static_cast<std::uint16_t>((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | frac);
}

std::string encode(const HandTensor& t) {
  std::string out;
  for (const float v : t.values) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
    if (t.dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&bits), 4);
    } else {
      const std::uint16_t h =
          t.dtype == "BF16" ? static_cast<std::uint16_t>(bits >> 16) : half_of(v);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

void write_hand_safetensors(const fs::path& path, const std::vector<HandTensor>& tensors) {
  json header = {{"__metadata__", {{"format", "pt"}}}};
  std::string data;
  for (const HandTensor& t : tensors) {
    const std::string b = encode(t);
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + b.size()}}};
    data += b;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[std::size_t(i)] = static_cast<char>((std::uint64_t(h.size()) >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << out << h << data;
}

// Every tensor of `layout` in HF shapes, element i of tensor k = (k + 1) + i / 8 (exact in every
// dtype for these sizes), dtypes rotating F32 / BF16 / F16.
std::vector<HandTensor> hand_tensors(const ParameterLayout& layout) {
  std::vector<HandTensor> out;
  const char* dtypes[] = {"F32", "BF16", "F16"};
  for (std::size_t k = 0; k < layout.tensors().size(); ++k) {
    const auto& t = layout.tensors()[k];
    HandTensor h{t.name, dtypes[k % 3], zo::model::hf_shape(t), {}};
    for (std::size_t i = 0; i < t.numel; ++i)
      h.values.push_back(static_cast<float>(k + 1) + static_cast<float>(i % 64) / 8.0f);
    out.push_back(std::move(h));
  }
  return out;
}

// What import must give for hand_tensors(layout): HF (in, out) Conv1D weights transposed back.
std::vector<float> hand_expected(const ParameterLayout& layout) {
  std::vector<float> out(layout.size());
  const auto hand = hand_tensors(layout);
  for (std::size_t k = 0; k < hand.size(); ++k) {
    const auto& t = layout.tensors()[k];
    for (std::size_t i = 0; i < t.numel; ++i) {
      std::size_t ours = i;
      if (t.hf_transposed) {  // HF element (c, r) of (in, out) is ours (r, c) of (out, in)
        const std::size_t rows = t.shape[0], cols = t.shape[1];
        ours = (i % rows) * cols + i / rows;
      }
      out[t.offset + ours] = hand[k].values[i];
    }
  }
  return out;
}

// ---- the shard plan -----------------------------------------------------------------------------

TEST(HfSharded, ThePlanKeepsOrderAndNeverSplitsATensor) {
  using V = std::vector<std::uint64_t>;
  using S = std::vector<std::size_t>;
  const auto plan = [](const V& b, std::uint64_t max) { return zo::ckpt::plan_shards(b, max); };
  EXPECT_EQ(plan({}, 8), S{});
  EXPECT_EQ(plan({4, 4}, 8), S{0}) << "exactly fits";
  EXPECT_EQ(plan({4, 4, 1}, 8), (S{0, 2}));
  EXPECT_EQ(plan({4, 5, 3}, 8), (S{0, 1}));
  EXPECT_EQ(plan({4, 20, 4}, 8), (S{0, 1, 2})) << "an oversized tensor is alone";
  EXPECT_EQ(plan({20, 8}, 8), (S{0, 1}));
  EXPECT_EQ(plan({3, 3, 3}, 1), (S{0, 1, 2}));
  EXPECT_EQ(plan({0, 0, 8, 0}, 8), S{0});
  EXPECT_EQ(zo::ckpt::shard_file_name(2, 13), "model-00002-of-00013.safetensors");
  EXPECT_TRUE(zo::ckpt::is_shard_file_name("model-00002-of-00013.safetensors"));
  EXPECT_FALSE(zo::ckpt::is_shard_file_name("model.safetensors"));
  EXPECT_FALSE(zo::ckpt::is_shard_file_name("consolidated.safetensors"));
}

// ---- export -------------------------------------------------------------------------------------

// The directory's shards hold every tensor once, in layout order, each within the size unless
// alone; the index's total_size is the sum of the tensors' bytes.
void expect_well_sharded(const fs::path& dir, const ParameterLayout& layout, DType dtype,
                         std::uint64_t max_bytes) {
  const json index = read_json(dir / "model.safetensors.index.json");
  const json& map = index.at("weight_map");
  ASSERT_EQ(map.size(), layout.tensors().size());
  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> shard_bytes;
  std::map<std::string, int> shard_count;
  std::string previous;
  for (const auto& t : layout.tensors()) {
    const std::string file = map.at(t.name);
    EXPECT_GE(file, previous) << t.name << ": shards follow layout order";
    previous = file;
    const auto f = zo::ckpt::SafetensorsFile::open(dir / file);
    EXPECT_EQ(f.info(t.name).dtype, dtype);
    EXPECT_EQ(f.info(t.name).nbytes(), t.numel * zo::dtype_size(dtype));
    total += f.info(t.name).nbytes();
    shard_bytes[file] += f.info(t.name).nbytes();
    ++shard_count[file];
  }
  EXPECT_EQ(index.at("metadata").at("total_size").get<std::uint64_t>(), total);
  for (const auto& [file, bytes] : shard_bytes) {
    EXPECT_TRUE(bytes <= max_bytes || shard_count[file] == 1) << file << " holds " << bytes;
    EXPECT_EQ(zo::ckpt::SafetensorsFile::open(dir / file).tensors().size(),
              std::size_t(shard_count[file]))
        << file;
  }
  const std::size_t n = shard_bytes.size();
  for (std::size_t k = 1; k <= n; ++k)
    EXPECT_TRUE(shard_bytes.count(zo::ckpt::shard_file_name(k, n))) << k << " of " << n;
}

TEST(HfExport, GptDirectoriesShardAtTheSizeAndLoadBack) {
  Scratch d;
  const auto spec = zo::model::load_model_spec("tiny");
  const ParameterLayout layout(spec);
  const auto params = random_params(layout, 1);
  const auto& wte = layout.find("wte.weight");  // 65536 bytes in fp32, the largest
  const auto& wpe = layout.find("wpe.weight");  // 16384 bytes
  const std::uint64_t wte_bytes = wte.numel * 4, wpe_bytes = wpe.numel * 4;
  std::vector<float> back(layout.size());

  // Smaller than one tensor: wte alone in shard 1, wpe starts shard 2.
  auto files = zo::model::export_hf_directory(d.path / "small", layout,
                                              zo::model::hf_source(params), DType::kF32, 20000);
  expect_well_sharded(d.path / "small", layout, DType::kF32, 20000);
  json map = read_json(d.path / "small" / "model.safetensors.index.json")["weight_map"];
  EXPECT_EQ(map["wte.weight"], files[1]);
  EXPECT_EQ(zo::ckpt::SafetensorsFile::open(d.path / "small" / files[1]).tensors().size(), 1u);
  EXPECT_EQ(map["wpe.weight"], files[2]);
  zo::model::import_hf_weights(d.path / "small", layout, back);
  EXPECT_EQ(back, params);

  // Exactly wte + wpe: both in shard 1, the next tensor starts shard 2.
  files = zo::model::export_hf_directory(d.path / "exact", layout, zo::model::hf_source(params),
                                         DType::kF32, wte_bytes + wpe_bytes);
  expect_well_sharded(d.path / "exact", layout, DType::kF32, wte_bytes + wpe_bytes);
  map = read_json(d.path / "exact" / "model.safetensors.index.json")["weight_map"];
  EXPECT_EQ(map["wte.weight"], files[1]);
  EXPECT_EQ(files[1].rfind("model-00001-of-", 0), 0u) << files[1];
  EXPECT_EQ(map["wpe.weight"], map["wte.weight"]);
  EXPECT_NE(map["h.0.ln_1.weight"], map["wte.weight"]);
  zo::model::import_hf_weights(d.path / "exact" / "model.safetensors.index.json", layout, back);
  EXPECT_EQ(back, params);

  // Everything fits: one model.safetensors, no index (as save_pretrained).
  const std::uint64_t all = layout.size() * 2;
  files = zo::model::export_hf_directory(d.path / "one", layout, zo::model::hf_source(params),
                                         DType::kBF16, all);
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(names_in(d.path / "one"), (std::set<std::string>{"config.json", "model.safetensors"}));
  files = zo::model::export_hf_directory(d.path / "two", layout, zo::model::hf_source(params),
                                         DType::kBF16, all - 1);
  EXPECT_EQ(files.size(), 4u) << "one byte less: two shards and the index";
  expect_well_sharded(d.path / "two", layout, DType::kBF16, all - 1);

  // config.json: what transformers' GPT2LMHeadModel reads, and what --model reads back.
  const json config = read_json(d.path / "one" / "config.json");
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["n_positions"], 64);
  EXPECT_EQ(config["n_ctx"], 64);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  EXPECT_EQ(config["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_FALSE(config.contains("name"));
  EXPECT_FALSE(config.contains("eos_token_id")) << "vocab 256 has no <|endoftext|>";
  EXPECT_TRUE(zo::model::load_model_spec((d.path / "one" / "config.json").string())
                  .same_architecture(spec));
  EXPECT_EQ(
      zo::model::hf_config(zo::model::load_model_spec("gpt2-124m"), DType::kF32).at("eos_token_id"),
      50256);
}

TEST(HfExport, LlamaAndQwen2DirectoriesCarryTheirConfigAndLoadBack) {
  Scratch d;
  for (const std::string name : {"tiny-llama", "tiny-qwen2"}) {
    const auto spec = zo::model::load_model_spec(name);
    const ParameterLayout layout(spec);
    const auto params = random_params(layout, 2);
    const fs::path dir = d.path / name;
    zo::model::export_hf_directory(dir, layout, zo::model::hf_source(params), DType::kF32, 50000);
    expect_well_sharded(dir, layout, DType::kF32, 50000);
    const json map = read_json(dir / "model.safetensors.index.json")["weight_map"];
    EXPECT_EQ(map.contains("lm_head.weight"), !spec.tie_word_embeddings) << name;
    EXPECT_TRUE(map.contains("model.layers.1.mlp.down_proj.weight")) << name;
    json want = spec.to_json();
    want.erase("name");
    want["torch_dtype"] = "float32";
    EXPECT_EQ(read_json(dir / "config.json"), want) << name;
    EXPECT_TRUE(zo::model::load_model_spec((dir / "config.json").string()).same_architecture(spec));
    std::vector<float> back(layout.size());
    zo::model::import_hf_weights(dir, layout, back);
    EXPECT_EQ(back, params) << name;
  }
}

// import -> export -> import: the second export's files equal the first's, byte for byte.
TEST(HfExport, ARoundTripGivesByteIdenticalFiles) {
  Scratch d;
  for (const std::string name : {"tiny", "tiny-llama", "tiny-qwen2"}) {
    const ParameterLayout layout(zo::model::load_model_spec(name));
    const auto params = random_params(layout, 3);
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string tag = name + "_" + std::string(zo::dtype_name(dtype));
      const fs::path a = d.path / (tag + "_a"), b = d.path / (tag + "_b");
      zo::model::export_hf_directory(a, layout, zo::model::hf_source(params), dtype, 30000);
      std::vector<float> back(layout.size());
      zo::model::import_hf_weights(a, layout, back);
      zo::model::export_hf_directory(b, layout, zo::model::hf_source(back), dtype, 30000);
      ASSERT_EQ(names_in(a), names_in(b)) << tag;
      EXPECT_GT(names_in(a).size(), 3u) << tag << ": sharded";
      for (const auto& f : names_in(a))
        EXPECT_EQ(bytes_of(a / f), bytes_of(b / f)) << tag << " " << f;
    }
  }
}

// A second export into the same directory replaces the first: no stale shard or index survives
// to contradict it, and files that are not weights stay.
TEST(HfExport, ReexportingReplacesThePreviousWeightsOnly) {
  Scratch d;
  const ParameterLayout layout(zo::model::load_model_spec("tiny"));
  const auto params = random_params(layout, 4);
  const fs::path dir = d.path / "out";
  zo::model::export_hf_directory(dir, layout, zo::model::hf_source(params), DType::kF32, 20000);
  std::ofstream(dir / "tokenizer.json") << "{}";
  const auto before = names_in(dir);
  zo::model::export_hf_directory(dir, layout, zo::model::hf_source(params), DType::kF32, 150000);
  const auto middle = names_in(dir);
  EXPECT_LT(middle.size(), before.size());
  std::vector<float> back(layout.size());
  zo::model::import_hf_weights(dir, layout, back);  // refuses a stale shard
  EXPECT_EQ(back, params);
  for (const auto& f : middle)
    EXPECT_TRUE(f == "tokenizer.json" || f == "config.json" || f.find("-of-") != f.npos ||
                f == "model.safetensors.index.json")
        << f;
  zo::model::export_hf_directory(dir, layout, zo::model::hf_source(params), DType::kF32);
  EXPECT_EQ(names_in(dir),
            (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  zo::model::import_hf_weights(dir, layout, back);
  EXPECT_EQ(back, params);
}

// ---- import of files written by hand ------------------------------------------------------------

TEST(HfImport, HandWrittenShardsOfMixedDtypesAreReadByName) {
  Scratch d;
  for (const auto& spec : {micro_gpt2(), micro_qwen2(false), micro_qwen2(true)}) {
    const ParameterLayout layout(spec);
    const auto hand = hand_tensors(layout);
    const fs::path dir = d.path / (spec.name + (spec.tie_word_embeddings ? "_tied" : "_untied"));
    fs::create_directories(dir);
    // Three shards, tensors in reverse order across them; the index written by hand as well.
    json map;
    std::vector<std::vector<HandTensor>> shards(3);
    for (std::size_t k = 0; k < hand.size(); ++k) {
      const std::size_t s = (hand.size() - 1 - k) * 3 / hand.size();
      shards[s].push_back(hand[k]);
      map[hand[k].name] = "part" + std::to_string(s) + ".safetensors";
    }
    for (std::size_t s = 0; s < 3; ++s)
      write_hand_safetensors(dir / ("part" + std::to_string(s) + ".safetensors"), shards[s]);
    std::ofstream(dir / "model.safetensors.index.json")
        << json{{"metadata", {{"total_size", 1}}}, {"weight_map", map}}.dump();
    std::vector<float> back(layout.size(), -1.0f);
    zo::model::import_hf_weights(dir, layout, back);
    EXPECT_EQ(back, hand_expected(layout)) << dir;
    // The same tensors in one hand-written file.
    write_hand_safetensors(dir / "one.safetensors", hand);
    std::fill(back.begin(), back.end(), -1.0f);
    zo::model::import_hf_weights(dir / "one.safetensors", layout, back);
    EXPECT_EQ(back, hand_expected(layout)) << dir;
  }
}

TEST(HfImport, LlamaHeadsTiedOrUntied) {
  Scratch d;
  const ParameterLayout tied(micro_qwen2(true)), untied(micro_qwen2(false));
  auto hand = hand_tensors(tied);
  const HandTensor embed = hand.front();
  std::vector<float> back(tied.size());
  // Tied: lm_head.weight may be absent or equal to the embedding, not different.
  hand.push_back({"lm_head.weight", embed.dtype, embed.shape, embed.values});
  write_hand_safetensors(d.path / "equal.safetensors", hand);
  zo::model::import_hf_weights(d.path / "equal.safetensors", tied, back);
  EXPECT_EQ(back, hand_expected(tied));
  hand.back().values[5] += 1.0f;
  write_hand_safetensors(d.path / "differs.safetensors", hand);
  std::string e =
      error_of([&] { zo::model::import_hf_weights(d.path / "differs.safetensors", tied, back); });
  EXPECT_HAS(e, "lm_head.weight differs from model.embed_tokens.weight");
  EXPECT_HAS(e, "tie_word_embeddings false");
  // Untied: lm_head.weight is a parameter like any other.
  std::vector<float> untied_back(untied.size());
  e = error_of(
      [&] { zo::model::import_hf_weights(d.path / "equal.safetensors", untied, untied_back); });
  EXPECT_TRUE(e == "(no error)") << e;
  write_hand_safetensors(d.path / "headless.safetensors", hand_tensors(tied));
  e = error_of(
      [&] { zo::model::import_hf_weights(d.path / "headless.safetensors", untied, untied_back); });
  EXPECT_HAS(e, "missing: lm_head.weight");
  // Older Llama saves carry RoPE frequencies: buffers, skipped.
  auto with_rope = hand_tensors(tied);
  with_rope.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, {1.0f, 0.5f}});
  write_hand_safetensors(d.path / "rope.safetensors", with_rope);
  zo::model::import_hf_weights(d.path / "rope.safetensors", tied, back);
  EXPECT_EQ(back, hand_expected(tied));
}

// ---- refusals -----------------------------------------------------------------------------------

class HfShardedRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    files_ = zo::model::export_hf_directory(dir_, layout_, zo::model::hf_source(params_),
                                            DType::kF32, 20000);
    ASSERT_GE(files_.size(), 5u);  // config, at least 3 shards, index
    index_ = read_json(dir_ / "model.safetensors.index.json");
  }
  // Imports after `edit` of the index; params must stay untouched on a refusal.
  std::string import_with(const json& index) {
    std::ofstream(dir_ / "model.safetensors.index.json", std::ios::trunc) << index.dump();
    return import_text();
  }
  std::string import_text() {
    std::vector<float> untouched(layout_.size(), -7.0f);
    const std::string e = error_of([&] { zo::model::import_hf_weights(dir_, layout_, untouched); });
    if (e != "(no error)") {
      EXPECT_EQ(untouched, std::vector<float>(layout_.size(), -7.0f)) << e;
    }
    return e;
  }
  std::string shard(std::size_t k) const { return files_[k]; }  // files_[1] is shard 1

  Scratch scratch_;
  fs::path dir_ = scratch_.path / "model";
  ParameterLayout layout_{zo::model::load_model_spec("tiny")};
  std::vector<float> params_ = random_params(layout_, 5);
  std::vector<std::string> files_;
  json index_;
};

TEST_F(HfShardedRefusals, TheIndexMustMatchItsShards) {
  EXPECT_EQ(import_text(), "(no error)");
  // A tensor mapped to a shard that lacks it (shard 2: wpe and ln_1; shard 3: c_attn.weight).
  json j = index_;
  ASSERT_EQ(j["weight_map"]["h.0.ln_1.weight"], shard(2));
  j["weight_map"]["h.0.ln_1.weight"] = shard(3);
  std::string e = import_with(j);
  EXPECT_HAS(e, "does not match its shards");
  EXPECT_HAS(e, "it maps h.0.ln_1.weight to " + shard(3) + ", which does not hold it");
  EXPECT_HAS(e, "h.0.ln_1.weight is in " + shard(2) + " but the index maps it to " + shard(3));
  // A tensor no entry lists.
  j = index_;
  j["weight_map"].erase("wpe.weight");
  EXPECT_HAS(import_with(j), shard(2) + " holds wpe.weight, which the index does not list");
  // A listed file that is not there.
  j = index_;
  j["weight_map"]["wpe.weight"] = "model-00009-of-00009.safetensors";
  e = import_with(j);
  EXPECT_HAS(e, "lists model-00009-of-00009.safetensors");
  EXPECT_HAS(e, "does not exist");
  // Path traversal, and other names that are not plain files beside the index.
  for (const std::string bad :
       {"../model-00001-of-00004.safetensors", "/etc/passwd", "sub/x", "..", ""}) {
    j = index_;
    j["weight_map"]["wte.weight"] = bad;
    e = import_with(j);
    EXPECT_HAS(e, "tensor 'wte.weight' is in '" + bad + "', which is not a plain file name");
  }
}

TEST_F(HfShardedRefusals, ATensorInTwoFilesIsRefused) {
  // Shard 2 rewritten with a copy of wte.weight besides its own tensors.
  zo::ckpt::SafetensorsWriter w;
  const auto f = zo::ckpt::SafetensorsFile::open(dir_ / shard(2));
  std::vector<std::vector<float>> keep;
  for (const auto& t : f.tensors()) {
    keep.emplace_back(t.numel);
    f.read_f32(t.name, keep.back());
    w.add(t.name, t.shape, keep.back());
  }
  const auto& wte = layout_.find("wte.weight");
  w.add("wte.weight", zo::model::hf_shape(wte),
        std::span<const float>(params_.data() + wte.offset, wte.numel));
  w.write(dir_ / shard(2));
  EXPECT_HAS(import_text(), "wte.weight is in " + shard(2) + " but the index maps it to " +
                                shard(1) + " (a tensor in two files?)");
}

TEST_F(HfShardedRefusals, StaleShardsAndAmbiguousDirectoriesAreRefused) {
  fs::copy_file(dir_ / shard(1), dir_ / "model-00001-of-00009.safetensors");
  EXPECT_HAS(import_text(),
             "model-00001-of-00009.safetensors is beside the index but not listed in it");
  fs::remove(dir_ / "model-00001-of-00009.safetensors");
  // Other safetensors files (Mistral's consolidated.safetensors) are not shards of the set.
  fs::copy_file(dir_ / shard(1), dir_ / "consolidated.safetensors");
  EXPECT_EQ(import_text(), "(no error)");
  fs::copy_file(dir_ / shard(1), dir_ / "model.safetensors");
  EXPECT_HAS(import_text(), "holds both model.safetensors and model.safetensors.index.json");
  fs::remove(dir_ / "model.safetensors");
  fs::remove(dir_ / "model.safetensors.index.json");
  EXPECT_HAS(import_text(), "holds neither model.safetensors nor model.safetensors.index.json");
}

TEST_F(HfShardedRefusals, MalformedIndexesAreRefused) {
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"metadata": {}})", "no \"weight_map\" object"},
      {R"({"weight_map": ["a"]})", "no \"weight_map\" object"},
      {R"({"weight_map": {}})", "\"weight_map\" lists no tensors"},
      {R"({"weight_map": {"wte.weight": 3}})", "the file of tensor 'wte.weight' is 3"},
      {R"({"metadata": 5, "weight_map": {"a": "b"}})", "\"metadata\" is not an object"},
      {R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})", "appears twice"},
  };
  for (const auto& [text, want] : cases) {
    std::ofstream(dir_ / "model.safetensors.index.json", std::ios::trunc) << text;
    const std::string e = import_text();
    EXPECT_HAS(e, "weights index");
    EXPECT_HAS(e, "model.safetensors.index.json");
    EXPECT_HAS(e, want);
  }
}

// A file of 200,000 unexpected one-element tensors is refused as quickly as it is read: its
// header used to take minutes (nlohmann's parser with a callback scans the enclosing object
// after each nested one, quadratic in the tensors).
// A file listing far more tensors than the model has is refused by its header's size, before the
// header is parsed (its JSON would take ~15 bytes of memory per byte); fewer unexpected ones are
// listed by name.
TEST(HfImport, AHeaderOfManyTensorsIsRefusedBeforeItIsParsed) {
  Scratch d;
  const ParameterLayout layout(micro_gpt2());
  std::vector<float> params(layout.size());
  for (const int count : {200000, 300}) {
    const fs::path file = d.path / ("junk" + std::to_string(count) + ".safetensors");
    const std::vector<float> values(count, 0.5f);
    {
      zo::ckpt::SafetensorsWriter w;
      for (int i = 0; i < count; ++i)
        w.add("junk." + std::to_string(i), {1}, std::span<const float>(values.data() + i, 1));
      w.write(file);
    }
    const std::string e = zo::test::error_within(
        std::chrono::seconds(60), [&] { zo::model::import_hf_weights(file, layout, params); });
    if (count > 1000) {
      EXPECT_HAS(e, "more than the tensors expected here need");
    } else {
      EXPECT_HAS(e, "unexpected: junk.0, junk.1");
      EXPECT_HAS(e, "(" + std::to_string(count) + " in all)");
    }
  }
}

TEST_F(HfShardedRefusals, MissingAndExtraTensorsAreListed) {
  // An extra tensor, listed and stored: refused as unexpected, as in one file.
  json j = index_;
  std::vector<float> extra(4, 1.0f);
  zo::ckpt::SafetensorsWriter w;
  w.add("h.7.mlp.extra", {4}, extra);
  w.write(dir_ / "model-00009-of-00009.safetensors");
  j["weight_map"]["h.7.mlp.extra"] = "model-00009-of-00009.safetensors";
  EXPECT_HAS(import_with(j), "unexpected: h.7.mlp.extra");
  // A model with one layer more: its second block is missing.
  const auto two_blocks = zo::model::model_spec_from_json(
      {{"n_layer", 3}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 256}, {"block_size", 64}},
      "three");
  const ParameterLayout three(two_blocks);
  std::vector<float> back(three.size(), -1.0f);
  fs::remove(dir_ / "model-00009-of-00009.safetensors");
  import_with(index_);
  const std::string e = error_of([&] { zo::model::import_hf_weights(dir_, three, back); });
  EXPECT_HAS(e, "missing: h.2.ln_1.weight");
  EXPECT_EQ(back, std::vector<float>(three.size(), -1.0f));
}

}  // namespace
