// Llama-family specs and layouts: presets against the parameter counts the models publish,
// Hugging Face config.json files as transformers writes them, every key that would change the
// computation refused by name, and the flat layout's names, fusions, groups and initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/layout.h"
#include "model/spec.h"

namespace {

using nlohmann::json;
using zo::model::load_model_spec;
using zo::model::model_spec_from_json;
using zo::model::ModelSpec;
using zo::model::ParameterLayout;
using zo::model::TensorKind;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

// meta-llama/Llama-3.2-1B's config.json as published (every key).
json llama32_1b_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

// Qwen/Qwen2.5-0.5B's config.json as published.
json qwen25_05b_config() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

TEST(LlamaSpec, PresetsHaveThePublishedParameterCounts) {
  // The counts the model cards and safetensors indexes give.
  const std::vector<std::pair<std::string, std::size_t>> published = {
      {"llama3.2-1b", 1235814400}, {"llama3.2-3b", 3212749824},  {"llama3.1-8b", 8030261248},
      {"qwen2.5-0.5b", 494032768}, {"qwen2.5-1.5b", 1543714304}, {"mistral-7b", 7248023552}};
  for (const auto& [name, count] : published) {
    const ModelSpec s = load_model_spec(name);
    EXPECT_TRUE(s.llama()) << name;
    EXPECT_EQ(s.num_parameters(), count) << name;
  }
}

TEST(LlamaSpec, ReadsHuggingFaceConfigs) {
  const ModelSpec l = model_spec_from_json(llama32_1b_config(), "config.json");
  EXPECT_TRUE(l.same_architecture(load_model_spec("llama3.2-1b")));
  EXPECT_EQ(l.model_type, "llama");
  EXPECT_EQ(l.n_kv_head, 8);
  EXPECT_EQ(l.head_dim, 64);
  EXPECT_EQ(l.intermediate_size, 8192);
  EXPECT_EQ(l.block_size, 131072);
  EXPECT_DOUBLE_EQ(l.rope_theta, 500000.0);
  EXPECT_TRUE(l.rope_scaling.llama3);
  EXPECT_DOUBLE_EQ(l.rope_scaling.factor, 32.0);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(l.tie_word_embeddings);
  EXPECT_FALSE(l.qkv_bias || l.o_bias);

  const ModelSpec q = model_spec_from_json(qwen25_05b_config(), "config.json");
  EXPECT_TRUE(q.same_architecture(load_model_spec("qwen2.5-0.5b")));
  EXPECT_TRUE(q.qkv_bias);  // Qwen2 always has q/k/v biases
  EXPECT_FALSE(q.o_bias);
  EXPECT_EQ(q.head_dim, 64);  // 896 / 14
  EXPECT_DOUBLE_EQ(q.norm_eps, 1e-6);

  // Mistral-style head_dim different from hidden / heads, and attention_bias on q, k, v and o.
  json j = llama32_1b_config();
  j["head_dim"] = 96;
  j["attention_bias"] = true;
  const ModelSpec m = model_spec_from_json(j, "config.json");
  EXPECT_EQ(m.head_dim, 96);
  EXPECT_EQ(m.qkv_width(), std::size_t(32 + 2 * 8) * 96);
  EXPECT_TRUE(m.qkv_bias && m.o_bias);
  // Absent optional keys take transformers' defaults.
  const ModelSpec d = model_spec_from_json({{"model_type", "mistral"},
                                            {"hidden_size", 64},
                                            {"num_hidden_layers", 1},
                                            {"num_attention_heads", 4},
                                            {"intermediate_size", 96},
                                            {"vocab_size", 10},
                                            {"max_position_embeddings", 32}},
                                           "minimal");
  EXPECT_EQ(d.n_kv_head, 4);
  EXPECT_EQ(d.head_dim, 16);
  EXPECT_DOUBLE_EQ(d.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(d.rope_theta, 10000.0);
  EXPECT_FALSE(d.tie_word_embeddings);
  EXPECT_FALSE(d.rope_scaling.llama3);
}

TEST(LlamaSpec, JsonRoundTripsEveryPreset) {
  for (const auto& name : zo::model::preset_names()) {
    const ModelSpec s = load_model_spec(name);
    const ModelSpec again = model_spec_from_json(s.to_json(), "again");
    EXPECT_TRUE(again.same_architecture(s)) << name;
    EXPECT_EQ(again.num_parameters(), s.num_parameters()) << name;
    EXPECT_EQ(again.name, s.name) << name;
  }
  // The architecture includes every Llama field.
  ModelSpec a = load_model_spec("tiny-llama"), b = a;
  b.rope_theta = 5e5;
  EXPECT_FALSE(a.same_architecture(b));
  b = a;
  b.rope_scaling.llama3 = true;
  b.rope_scaling.original_max_position_embeddings = 64;
  EXPECT_FALSE(a.same_architecture(b));
}

TEST(LlamaSpec, RefusesWhatItDoesNotImplementByName) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["rope_scaling"]["rope_type"] = "yarn"; }, "rope_scaling type \"yarn\""},
      {[](json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
       },
       "\"linear\""},
      {[](json& j) { j["rope_scaling"].erase("low_freq_factor"); }, "needs 'low_freq_factor'"},
      {[](json& j) { j["rope_scaling"]["high_freq_factor"] = 0.5; }, "low_freq_factor <"},
      {[](json& j) { j["num_local_experts"] = 8; }, "num_local_experts"},
      {[](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act = \"gelu\" is not supported"},
      {[](json& j) { j["mlp_bias"] = true; }, "mlp_bias = true is not supported"},
      {[](json& j) { j["pretraining_tp"] = 2; }, "pretraining_tp = 2"},
      {[](json& j) { j["num_key_value_heads"] = 5; }, "must divide num_attention_heads"},
      {[](json& j) { j["num_key_value_heads"] = 64; }, "must divide num_attention_heads"},
      {[](json& j) { j["head_dim"] = 63; }, "head_dim = 63 must be even"},
      {[](json& j) { j["rms_norm_eps"] = 0; }, "rms_norm_eps"},
      {[](json& j) { j["rope_theta"] = "big"; }, "rope_theta must be a finite number"},
      {[](json& j) { j["use_sliding_window"] = false; }, "use_sliding_window is not a key"},
      {[](json& j) { j["model_type"] = "gemma"; }, "model_type = \"gemma\" is not supported"},
      {[](json& j) { j.erase("intermediate_size"); }, "missing key 'intermediate_size'"},
      {[](json& j) { j["tie_word_embeddings"] = "yes"; }, "tie_word_embeddings must be true"},
      {[](json& j) { j["num_hidden_layers"] = 5000; }, "num_hidden_layers = 5000 is above"},
      {[](json& j) { j["layer_types"] = {"sliding_attention"}; }, "layer_types is not a key"},
  };
  for (const auto& [change, want] : cases) {
    json j = llama32_1b_config();
    change(j);
    const std::string e = error_of([&] { model_spec_from_json(j, "'cfg'"); });
    EXPECT_NE(e.find(want), std::string::npos) << "want: " << want << "\ngot: " << e;
  }
  // Mistral 7B v0.1's window (4096 of 32768) would mask: refused; a null one (v0.3) is not.
  json m = load_model_spec("mistral-7b").to_json();
  m["sliding_window"] = 4096;
  EXPECT_NE(error_of([&] { model_spec_from_json(m, "'m'"); }).find("sliding_window = 4096"),
            std::string::npos);
  m["sliding_window"] = nullptr;
  EXPECT_EQ(error_of([&] { model_spec_from_json(m, "'m'"); }), "(no error)");
  json q = qwen25_05b_config();
  q["use_sliding_window"] = true;
  EXPECT_NE(error_of([&] { model_spec_from_json(q, "'q'"); }).find("use_sliding_window = true"),
            std::string::npos);
  q = qwen25_05b_config();
  q["layer_types"] = json::array({"full_attention", "sliding_attention"});
  EXPECT_NE(error_of([&] { model_spec_from_json(q, "'q'"); }).find("full_attention"),
            std::string::npos);
}

TEST(LlamaLayout, NamesFusionsAndGroups) {
  json j = load_model_spec("tiny-llama").to_json();
  j["attention_bias"] = true;  // q, k, v and o biases
  const ModelSpec s = model_spec_from_json(j, "t");
  const ParameterLayout layout(s);
  const std::size_t C = 64, D = 16, Q = 4 * D, KV = 2 * D, I = 96, V = 256;
  EXPECT_EQ(layout.size(), s.num_parameters());
  EXPECT_EQ(layout.find("model.embed_tokens.weight").shape, (std::vector<std::size_t>{V, C}));
  const auto& b = layout.llama_block(1);
  const auto off = [&](const std::string& n) { return layout.find(n).offset; };
  const std::string p = "model.layers.1.";
  // q|k|v and gate|up are adjacent: one fused matrix each, (out, in) like nn.Linear.
  EXPECT_EQ(b.qkv_w, off(p + "self_attn.q_proj.weight"));
  EXPECT_EQ(off(p + "self_attn.k_proj.weight"), b.qkv_w + Q * C);
  EXPECT_EQ(off(p + "self_attn.v_proj.weight"), b.qkv_w + (Q + KV) * C);
  EXPECT_EQ(b.qkv_b, off(p + "self_attn.q_proj.bias"));
  EXPECT_EQ(off(p + "self_attn.v_proj.bias"), b.qkv_b + Q + KV);
  EXPECT_EQ(b.o_b, off(p + "self_attn.o_proj.bias"));
  EXPECT_EQ(layout.find(p + "self_attn.o_proj.weight").shape, (std::vector<std::size_t>{C, Q}));
  EXPECT_EQ(off(p + "mlp.up_proj.weight"), b.gate_up_w + I * C);
  EXPECT_EQ(layout.find(p + "mlp.down_proj.weight").shape, (std::vector<std::size_t>{C, I}));
  EXPECT_EQ(b.mlp_norm, off(p + "post_attention_layernorm.weight"));
  // Groups: embeddings, each block, then the final norm with the untied head.
  ASSERT_EQ(layout.groups().size(), 4u);
  EXPECT_EQ(layout.groups()[0].end, V * C);
  EXPECT_EQ(layout.group_of(layout.lm_head()), 3u);
  EXPECT_EQ(layout.group_name(3), "head");
  EXPECT_EQ(layout.lm_head(), off("lm_head.weight"));
  EXPECT_EQ(layout.groups().back().end, layout.size());
  // Without attention_bias there are no bias tensors at all; tied: no lm_head.weight.
  const ParameterLayout plain(load_model_spec("tiny-llama"));
  for (const auto& t : plain.tensors())
    EXPECT_NE(t.kind, TensorKind::kBias) << t.name;
  EXPECT_EQ(plain.llama_block(0).qkv_b, zo::model::LlamaBlockParams::kNone);
  const ParameterLayout tied(load_model_spec("tiny-qwen2"));
  EXPECT_EQ(tied.lm_head(), tied.wte());
  EXPECT_THROW(tied.find("lm_head.weight"), std::out_of_range);
}

TEST(LlamaLayout, WeightDecayGroups) {
  const ParameterLayout layout(load_model_spec("tiny-llama"));  // untied head
  const zo::model::WeightDecayPolicy def;
  zo::model::WeightDecayPolicy all;
  all.embeddings = all.biases_and_norms = true;
  for (const auto& t : layout.tensors()) {
    const bool linear = t.name.ends_with("proj.weight") || t.name == "lm_head.weight";
    EXPECT_EQ(def.applies_to(t), linear) << t.name;
    EXPECT_TRUE(all.applies_to(t)) << t.name;
  }
}

TEST(LlamaLayout, InitialisationFollowsTheConfig) {
  json j = load_model_spec("tiny-qwen2").to_json();
  j["initializer_range"] = 0.05;
  const ParameterLayout layout(model_spec_from_json(j, "t"));
  std::vector<float> p(layout.size(), -7.0f);
  zo::model::init_weights(layout, 11, p.data());
  for (const auto& t : layout.tensors()) {
    SCOPED_TRACE(t.name);
    double sum = 0, sum2 = 0;
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) {
      sum += p[i];
      sum2 += double(p[i]) * p[i];
    }
    const double n = double(t.numel), mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
    switch (t.kind) {
      case TensorKind::kNormWeight:
        EXPECT_EQ(sum, n);  // all ones
        break;
      case TensorKind::kBias:
        EXPECT_EQ(sum2, 0.0);
        break;
      default:  // N(0, 0.05) for every matrix (no residual scaling) and the embedding
        ASSERT_GT(n, 1000.0);
        EXPECT_NEAR(sd, 0.05, 0.05 * 6 / std::sqrt(n)) << "standard deviation";
        EXPECT_NEAR(mean, 0.0, 0.05 * 6 / std::sqrt(n));
    }
  }
}

}  // namespace
