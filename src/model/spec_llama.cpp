// Llama-family specs from a Hugging Face config.json (model_type llama, mistral, qwen2) and back.
// Every key that changes the computation is implemented or refused by name: a sliding window
// that would apply, another rope type, MoE or any key not listed here.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "model/spec_internal.h"

namespace zo::model::detail {
namespace {

// Read into the spec (sizes, attention, RoPE, norms, init).
const std::set<std::string> kImplemented = {"hidden_size",
                                            "num_hidden_layers",
                                            "num_attention_heads",
                                            "num_key_value_heads",
                                            "head_dim",
                                            "intermediate_size",
                                            "vocab_size",
                                            "max_position_embeddings",
                                            "rms_norm_eps",
                                            "rope_theta",
                                            "rope_scaling",
                                            "attention_bias",
                                            "tie_word_embeddings",
                                            "initializer_range",
                                            "name",
                                            "model_type"};
// Accepted only where they change nothing (checked below).
const std::set<std::string> kConditional = {
    "hidden_act",         "mlp_bias",          "pretraining_tp", "sliding_window",
    "use_sliding_window", "max_window_layers", "layer_types"};
// No effect on training: dropout (this trainer uses none), token ids, dtypes, bookkeeping.
const std::set<std::string> kIgnored = {"_name_or_path",    "architectures", "attention_dropout",
                                        "bos_token_id",     "dtype",         "eos_token_id",
                                        "pad_token_id",     "torch_dtype",   "transformers_version",
                                        "use_cache",        "return_dict",   "output_hidden_states",
                                        "output_attentions"};

const char* const kModelTypes[] = {"llama", "mistral", "qwen2"};

void check_keys(const nlohmann::json& j, const std::string& type, const std::string& origin) {
  std::vector<std::string> unknown;
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    if (!kImplemented.count(k) && !kConditional.count(k) && !kIgnored.count(k))
      unknown.push_back(k);
  }
  if (!unknown.empty()) {
    bad_spec(origin, "key(s) not supported for model_type \"" + type + "\": " + join(unknown) +
                         " (this trainer implements dense Llama / Mistral / Qwen2 models; "
                         "docs/training.md lists the keys it reads)");
  }
  // Keys of one family only.
  auto refuse_unless = [&](const char* key, bool allowed) {
    if (j.contains(key) && !allowed) {
      bad_spec(origin, std::string(key) + " is not a key of model_type \"" + type +
                           "\"; remove it or fix model_type");
    }
  };
  refuse_unless("attention_bias", type == "llama");
  refuse_unless("mlp_bias", type == "llama");
  refuse_unless("pretraining_tp", type == "llama");
  refuse_unless("use_sliding_window", type == "qwen2");
  refuse_unless("max_window_layers", type == "qwen2");
  refuse_unless("layer_types", type == "qwen2");
}

// The keys that must hold one value for the computation to be what this trainer runs.
void check_conditional(const nlohmann::json& j, const std::string& type, int context,
                       const std::string& origin) {
  auto fixed = [&](const char* key, const nlohmann::json& want, const char* why) {
    if (j.contains(key) && j[key] != want) {
      bad_spec(origin, std::string(key) + " = " + j[key].dump() + " is not supported (only " +
                           want.dump() + ": " + why + ")");
    }
  };
  fixed("hidden_act", "silu", "the MLP is SwiGLU");
  fixed("mlp_bias", false, "the MLP has no biases");
  fixed("pretraining_tp", 1, "tensor-parallel slicing of the projections is not emulated");
  fixed("use_sliding_window", false, "attention is full causal attention");
  if (j.contains("layer_types")) {
    const auto& t = j["layer_types"];
    if (!t.is_array() ||
        !std::all_of(t.begin(), t.end(), [](const auto& v) { return v == "full_attention"; })) {
      bad_spec(origin,
               "layer_types must list only \"full_attention\" (sliding-window layers "
               "are not implemented)");
    }
  }
  // A window at least as long as the context never masks anything; Qwen2 applies its window
  // only with use_sliding_window (refused above).
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() && type != "qwen2") {
    const auto& w = j["sliding_window"];
    if (!w.is_number_integer() || w.get<std::int64_t>() < context) {
      bad_spec(origin, "sliding_window = " + w.dump() +
                           " is below max_position_embeddings = " + std::to_string(context) +
                           "; sliding-window attention is not implemented (use a config "
                           "with sliding_window null)");
    }
  }
}

RopeScaling rope_scaling_from(const nlohmann::json& r, const std::string& origin) {
  RopeScaling out;
  if (r.is_null()) return out;
  if (!r.is_object()) bad_spec(origin, "rope_scaling must be null or an object");
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  const std::string type = r.contains(type_key) && r[type_key].is_string()
                               ? r[type_key].get<std::string>()
                               : std::string("(none given)");
  if (type == "default") return out;
  if (type != "llama3") {
    bad_spec(origin, "rope_scaling type \"" + type +
                         "\" is not supported (only \"llama3\", or rope_scaling null)");
  }
  for (const auto& item : r.items()) {
    const std::string& k = item.key();
    if (k != "rope_type" && k != "type" && k != "factor" && k != "low_freq_factor" &&
        k != "high_freq_factor" && k != "original_max_position_embeddings") {
      bad_spec(origin, "rope_scaling key '" + k + "' is not supported for rope_type llama3");
    }
  }
  for (const char* k :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (!r.contains(k)) bad_spec(origin, std::string("rope_scaling (llama3) needs '") + k + "'");
  }
  out.llama3 = true;
  out.factor = finite_number(r, "factor", origin);
  out.low_freq_factor = finite_number(r, "low_freq_factor", origin);
  out.high_freq_factor = finite_number(r, "high_freq_factor", origin);
  out.original_max_position_embeddings =
      positive_int(r, "original_max_position_embeddings", origin);
  return out;
}

bool boolean(const nlohmann::json& j, const char* key, bool fallback, const std::string& origin) {
  if (!j.contains(key)) return fallback;
  if (!j[key].is_boolean()) bad_spec(origin, std::string(key) + " must be true or false");
  return j[key].get<bool>();
}

// An optional key: its value, or `fallback` when absent or null.
double number_or(const nlohmann::json& j, const char* key, double fallback,
                 const std::string& origin) {
  return j.contains(key) && !j[key].is_null() ? finite_number(j, key, origin) : fallback;
}
int int_or(const nlohmann::json& j, const char* key, int fallback, const std::string& origin) {
  return j.contains(key) && !j[key].is_null() ? positive_int(j, key, origin) : fallback;
}

}  // namespace

ModelSpec llama_spec_from_json(const nlohmann::json& j, const std::string& origin) {
  const auto& mt = j.at("model_type");
  const std::string type = mt.is_string() ? mt.get<std::string>() : mt.dump();
  if (std::none_of(std::begin(kModelTypes), std::end(kModelTypes),
                   [&](const char* t) { return type == t; })) {
    bad_spec(origin, "model_type = " + mt.dump() +
                         " is not supported (this trainer implements \"gpt2\", \"llama\", "
                         "\"mistral\" and \"qwen2\": dense decoder models of those families)");
  }
  check_keys(j, type, origin);
  for (const char* k : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "vocab_size", "max_position_embeddings"}) {
    if (!j.contains(k)) bad_spec(origin, std::string("missing key '") + k + "'");
  }
  ModelSpec s;
  s.name = spec_name(j, origin);
  s.arch = Arch::kLlama;
  s.model_type = type;
  s.n_layer = positive_int(j, "num_hidden_layers", origin);
  s.n_head = positive_int(j, "num_attention_heads", origin);
  s.n_embd = positive_int(j, "hidden_size", origin);
  s.vocab_size = positive_int(j, "vocab_size", origin);
  s.block_size = positive_int(j, "max_position_embeddings", origin);
  s.intermediate_size = positive_int(j, "intermediate_size", origin);
  s.n_kv_head = int_or(j, "num_key_value_heads", s.n_head, origin);
  if (!j.contains("head_dim") || j["head_dim"].is_null()) {
    if (s.n_embd % s.n_head != 0) {
      bad_spec(origin, "hidden_size = " + std::to_string(s.n_embd) +
                           " is not divisible by num_attention_heads = " +
                           std::to_string(s.n_head) + "; give head_dim explicitly");
    }
    s.head_dim = s.n_embd / s.n_head;
  } else {
    s.head_dim = positive_int(j, "head_dim", origin);
  }
  // transformers' defaults for these three families.
  s.norm_eps = number_or(j, "rms_norm_eps", 1e-6, origin);
  s.rope_theta = number_or(j, "rope_theta", 10000.0, origin);
  s.init_std = number_or(j, "initializer_range", 0.02, origin);
  s.rope_scaling =
      j.contains("rope_scaling") ? rope_scaling_from(j["rope_scaling"], origin) : RopeScaling{};
  s.tie_word_embeddings = boolean(j, "tie_word_embeddings", false, origin);
  const bool attention_bias = boolean(j, "attention_bias", false, origin);
  s.qkv_bias = type == "qwen2" || attention_bias;  // Qwen2 always has q/k/v biases
  s.o_bias = attention_bias;
  check_conditional(j, type, s.block_size, origin);
  s.validate();
  return s;
}

nlohmann::json llama_spec_to_json(const ModelSpec& s) {
  const char* arch = s.model_type == "mistral" ? "MistralForCausalLM"
                     : s.model_type == "qwen2" ? "Qwen2ForCausalLM"
                                               : "LlamaForCausalLM";
  nlohmann::json j = {{"architectures", {arch}},
                      {"model_type", s.model_type},
                      {"hidden_size", s.n_embd},
                      {"num_hidden_layers", s.n_layer},
                      {"num_attention_heads", s.n_head},
                      {"num_key_value_heads", s.n_kv_head},
                      {"head_dim", s.head_dim},
                      {"intermediate_size", s.intermediate_size},
                      {"vocab_size", s.vocab_size},
                      {"max_position_embeddings", s.block_size},
                      {"rms_norm_eps", s.norm_eps},
                      {"rope_theta", s.rope_theta},
                      {"rope_scaling", nullptr},
                      {"hidden_act", "silu"},
                      {"initializer_range", s.init_std},
                      {"tie_word_embeddings", s.tie_word_embeddings},
                      {"name", s.name}};
  if (s.rope_scaling.llama3) {
    const RopeScaling& r = s.rope_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  if (s.model_type == "llama") j["attention_bias"] = s.o_bias;
  if (s.model_type == "mistral") j["sliding_window"] = nullptr;
  if (s.model_type == "qwen2") j["use_sliding_window"] = false;
  return j;
}

}  // namespace zo::model::detail
