// Model architecture hyperparameters: GPT-2 (our JSON keys or a Hugging Face / nanoGPT GPT-2
// config) and the Llama family (a Hugging Face config.json of model_type llama, mistral or qwen2),
// from a file or a named preset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zo::model {

// Limits of a model spec (ModelSpec::validate): far above what fits any machine, low enough that
// all sizes are exact in size_t.
inline constexpr int kMaxLayers = 4096, kMaxEmbd = 65536, kMaxBlock = 1 << 20;
inline constexpr int kMaxVocab = 1 << 24;
inline constexpr int kMaxHeadDim = 1024, kMaxIntermediate = 1 << 20;
inline constexpr std::size_t kMaxParameters = std::size_t{1} << 42;  // 4.4e12

enum class Arch {
  kGpt2,   // learned positions, LayerNorm, GELU MLP, biases everywhere, tied LM head
  kLlama,  // RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, optional q/k/v(/o) biases
};

// Llama 3's frequency-dependent RoPE scaling (rope_scaling with rope_type "llama3"): wavelengths
// above original_max_position_embeddings / low_freq_factor are divided by `factor`, those below
// original / high_freq_factor are kept, and the band between is interpolated.
struct RopeScaling {
  bool llama3 = false;  // false: plain RoPE (rope_scaling null)
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 0;
  bool operator==(const RopeScaling&) const = default;
};

struct ModelSpec {
  std::string name;  // preset name or the file it came from
  Arch arch = Arch::kGpt2;
  // Hugging Face model_type: "gpt2", or "llama", "mistral", "qwen2" (all Arch::kLlama; it names
  // the exported config's architecture).
  std::string model_type = "gpt2";
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;      // C
  int vocab_size = 0;  // V
  int block_size = 0;  // maximum sequence length (n_positions, max_position_embeddings)

  // ---- Arch::kLlama only (GPT-2 keeps the defaults) ----
  int n_kv_head = 0;          // num_key_value_heads: query head h reads kv head h / (Hq / Hkv)
  int head_dim = 0;           // D; may differ from C / n_head (Mistral-style)
  int intermediate_size = 0;  // I, the SwiGLU width
  double norm_eps = 1e-5;     // rms_norm_eps
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;            // biases on q, k and v (Qwen2; attention_bias)
  bool o_bias = false;              // a bias on the output projection too (attention_bias)
  bool tie_word_embeddings = true;  // GPT-2 always ties; a Llama has lm_head.weight otherwise
  double init_std = 0.02;           // initializer_range: N(0, init_std) for matrices, embeddings

  bool llama() const { return arch == Arch::kLlama; }
  int kv_heads() const { return llama() ? n_kv_head : n_head; }
  int head_size() const { return llama() ? head_dim : n_embd / n_head; }
  // Width of the fused q|k|v projection: (Hq + 2 Hkv) D; 3C for GPT-2.
  std::size_t qkv_width() const {
    return std::size_t(n_head + 2 * kv_heads()) * std::size_t(head_size());
  }

  void validate() const;  // throws std::invalid_argument naming the field and the fix
  std::size_t num_parameters() const;
  // GPT-2: our keys (n_layer, ...). Llama family: a Hugging Face config.json's keys, so the
  // object is also what export writes and transformers reads.
  nlohmann::json to_json() const;
  bool same_architecture(const ModelSpec& o) const;  // everything but the name
};

// "gpt2-124m" etc., or a path to a .json file. Throws with the list of presets when neither.
ModelSpec load_model_spec(const std::string& preset_or_path);
ModelSpec model_spec_from_json(const nlohmann::json& j, const std::string& origin);
std::vector<std::string> preset_names();

}  // namespace zo::model
