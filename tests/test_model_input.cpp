// Hostile or foreign input to the model module: Hugging Face / nanoGPT config keys that would
// change the architecture, spec files that are deep, repeat keys or are not regular files, and
// weight files with repeated or untied tensors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "input_test.h"
#include "model/hf_weights.h"
#include "model/layout.h"
#include "model/spec.h"

namespace {

namespace fs = std::filesystem;
using zo::model::load_model_spec;
using zo::model::model_spec_from_json;
using zo::test::error_of;
using zo::test::Scratch;

// The config.json of Hugging Face's "gpt2", as published.
const char* const kGpt2Config = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
  "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
  "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
  "summary_type": "cls_index", "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

TEST(ModelConfig, PublishedGpt2AndNanoGptConfigsAreAccepted) {
  const auto hf = model_spec_from_json(nlohmann::json::parse(kGpt2Config), "gpt2");
  EXPECT_TRUE(hf.same_architecture(load_model_spec("gpt2-124m")));
  nlohmann::json newer = nlohmann::json::parse(kGpt2Config);
  newer.update({{"n_inner", nullptr},
                {"scale_attn_weights", true},
                {"scale_attn_by_inverse_layer_idx", false},
                {"reorder_and_upcast_attn", false},
                {"tie_word_embeddings", true},
                {"n_special", 0},
                {"transformers_version", "4.40.0"},
                {"use_cache", true},
                {"torch_dtype", "float32"}});
  EXPECT_TRUE(model_spec_from_json(newer, "gpt2").same_architecture(hf));
  newer["n_inner"] = 3072;  // 4 * n_embd, written out
  newer["activation_function"] = "gelu_pytorch_tanh";
  EXPECT_TRUE(model_spec_from_json(newer, "gpt2").same_architecture(hf));
  // nanoGPT's GPTConfig.
  const auto nano = model_spec_from_json({{"block_size", 1024},
                                          {"vocab_size", 50257},
                                          {"n_layer", 12},
                                          {"n_head", 12},
                                          {"n_embd", 768},
                                          {"dropout", 0.0},
                                          {"bias", true}},
                                         "nanogpt");
  EXPECT_TRUE(nano.same_architecture(hf));
}

TEST(ModelConfig, KeysThatChangeTheModelAreRefusedByName) {
  const nlohmann::json base = nlohmann::json::parse(kGpt2Config);
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* supported;
  };
  const Case cases[] = {
      {"n_inner", 1024, "null or 4 * n_embd"},
      {"activation_function", "gelu", "\"gelu_new\" or \"gelu_pytorch_tanh\""},
      {"activation_function", "relu", "gelu_new"},
      {"layer_norm_epsilon", 1e-6, "1e-05"},
      {"scale_attn_weights", false, "true"},
      {"scale_attn_by_inverse_layer_idx", true, "false"},
      {"reorder_and_upcast_attn", true, "false"},
      {"bias", false, "true"},
      {"tie_word_embeddings", false, "true"},
      {"model_type", "gpt_neo", "\"gpt2\""},
      {"add_cross_attention", true, "false"},
      {"n_special", 2, "0"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = base;
    j[c.key] = c.value;
    const std::string e = error_of([&] { model_spec_from_json(j, "'config.json'"); });
    EXPECT_HAS(e, "'config.json'");
    EXPECT_HAS(e, std::string(c.key) + " = " + c.value.dump() + " is not supported");
    EXPECT_HAS(e, c.supported);
  }
  nlohmann::json j = base;
  j["n_ctx"] = 2048;  // n_positions is 1024
  EXPECT_HAS(error_of([&] { model_spec_from_json(j, "c"); }),
             "n_positions = 1024 and n_ctx = 2048 disagree");
  j = base;
  j["rotary_dim"] = 64;  // another architecture's key
  EXPECT_HAS(error_of([&] { model_spec_from_json(j, "c"); }), "unknown key(s): rotary_dim");
  j = base;
  j["name"] = 7;
  EXPECT_HAS(error_of([&] { model_spec_from_json(j, "c"); }), "name must be a string");
}

TEST(ModelSpecFile, DeepRepeatedOrNonRegularFilesAreRefused) {
  Scratch d;
  const auto spec_file = [&](const std::string& name, const std::string& text) {
    std::ofstream(d.path / name) << text;
    return (d.path / name).string();
  };
  // A million levels deep where an integer belongs: the old reader printed it in its message.
  const std::string deep = spec_file(
      "deep.json", R"({"n_layer": )" + std::string(1 << 20, '[') + std::string(1 << 20, ']') +
                       R"(, "n_head": 2, "n_embd": 8, "vocab_size": 5, "block_size": 4})");
  EXPECT_HAS(error_of([&] { load_model_spec(deep); }), "deeper than 64 levels");
  const std::string twice = spec_file(
      "twice.json",
      R"({"n_layer": 2, "n_head": 2, "n_embd": 8, "vocab_size": 5, "block_size": 4, "n_layer": 9})");
  const std::string e = error_of([&] { load_model_spec(twice); });
  EXPECT_HAS(e, "twice.json");
  EXPECT_HAS(e, "key \"n_layer\" appears twice");

  const fs::path fifo = d.path / "spec.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(zo::test::error_without_blocking(fifo, [&] { load_model_spec(fifo.string()); }),
             "is a FIFO (named pipe), not a regular file");
  EXPECT_HAS(error_of([&] { load_model_spec(d.path.string()); }),
             "is a directory, not a regular file");
}

// Every tiny-model tensor in Hugging Face form, plus `extra` tensors, in one file.
void write_weights(const fs::path& path, const zo::model::ParameterLayout& layout,
                   const std::vector<float>& params,
                   const std::vector<std::pair<std::string, std::vector<float>>>& extra) {
  zo::ckpt::SafetensorsWriter w;
  zo::model::add_hf_weights(w, layout, zo::model::hf_source(params), zo::DType::kF32);
  const auto& wte = layout.find("wte.weight");
  for (const auto& [name, values] : extra)
    w.add(name, zo::model::hf_shape(wte), values);
  w.write(path);
}

TEST(HfImport, RepeatedUntiedAndFifoWeightsAreRefused) {
  Scratch d;
  const zo::model::ParameterLayout layout(load_model_spec("tiny"));
  std::vector<float> params(layout.size());
  zo::model::init_weights(layout, 5, params.data());
  const auto& wte = layout.find("wte.weight");
  const std::vector<float> wte_values(params.begin() + long(wte.offset),
                                      params.begin() + long(wte.offset + wte.numel));
  std::vector<float> back(layout.size());

  // A tied LM head (as some exporters write it) loads.
  write_weights(d.path / "tied.safetensors", layout, params, {{"lm_head.weight", wte_values}});
  zo::model::import_hf_weights(d.path / "tied.safetensors", layout, back);
  EXPECT_EQ(back, params);
  // An untied one is another model.
  std::vector<float> other = wte_values;
  other[3] += 1.0f;
  write_weights(d.path / "untied.safetensors", layout, params, {{"lm_head.weight", other}});
  std::string e =
      error_of([&] { zo::model::import_hf_weights(d.path / "untied.safetensors", layout, back); });
  EXPECT_HAS(e, "lm_head.weight differs from wte.weight");
  EXPECT_HAS(e, "untied weights cannot be loaded");
  // One tensor under both of its names: which is meant?
  write_weights(d.path / "twice.safetensors", layout, params, {{"transformer.wte.weight", other}});
  e = error_of([&] { zo::model::import_hf_weights(d.path / "twice.safetensors", layout, back); });
  EXPECT_HAS(e, "given twice (with and without 'transformer.'): ");
  EXPECT_HAS(e, "transformer.wte.weight and wte.weight");

  const fs::path fifo = d.path / "pipe.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(zo::test::error_without_blocking(
                 fifo, [&] { zo::model::import_hf_weights(fifo, layout, back); }),
             "is a FIFO (named pipe), not a regular file");
}

}  // namespace
