// GPT-2 specs: our keys (n_layer, n_head, n_embd, vocab_size, block_size) or a Hugging Face /
// nanoGPT GPT-2 config. Every key that would change the computation is accepted only with the
// value this GPT-2 implements and refused by name otherwise; unknown keys are refused.
#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "model/spec_internal.h"

namespace zo::model::detail {
namespace {

// Hugging Face GPT-2 and nanoGPT config keys that would change what is computed: accepted only
// with the value this model implements, refused by name otherwise.
struct FixedKey {
  const char* key;
  const char* supported;  // for the message
  bool (*ok)(const nlohmann::json& value, const nlohmann::json& spec);
};
bool is_true(const nlohmann::json& v, const nlohmann::json&) {
  return v.is_boolean() && v.get<bool>();
}
bool is_false(const nlohmann::json& v, const nlohmann::json&) {
  return v.is_boolean() && !v.get<bool>();
}
const FixedKey kFixedKeys[] = {
    {"model_type", "\"gpt2\"", [](const auto& v, const auto&) { return v == "gpt2"; }},
    {"activation_function", "\"gelu_new\" or \"gelu_pytorch_tanh\" (GELU, tanh form)",
     [](const auto& v, const auto&) { return v == "gelu_new" || v == "gelu_pytorch_tanh"; }},
    {"layer_norm_epsilon", "1e-05",
     [](const auto& v, const auto&) { return v.is_number() && v.template get<double>() == 1e-5; }},
    {"n_inner", "null or 4 * n_embd",
     [](const auto& v, const auto& j) {
       return v.is_null() ||
              (v.is_number_integer() && j.at("n_embd").is_number_integer() &&
               v.template get<std::int64_t>() == 4 * j.at("n_embd").template get<std::int64_t>());
     }},
    {"scale_attn_weights", "true", is_true},
    {"scale_attn_by_inverse_layer_idx", "false", is_false},
    {"reorder_and_upcast_attn", "false", is_false},
    {"bias", "true (biases in every Linear and LayerNorm)", is_true},
    {"tie_word_embeddings", "true (the LM head is wte)", is_true},
    {"add_cross_attention", "false", is_false},
    {"is_encoder_decoder", "false", is_false},
    {"n_special", "0", [](const auto& v, const auto&) { return v == 0; }},
};

// Keys that do not change the computation: dropout (this trainer uses none), token ids, the
// initialisation range (init is GPT-2's own), bookkeeping of transformers and nanoGPT.
const std::set<std::string> kIgnoredKeys = {"_name_or_path",
                                            "_num_labels",
                                            "architectures",
                                            "attn_pdrop",
                                            "bos_token_id",
                                            "dropout",
                                            "embd_pdrop",
                                            "eos_token_id",
                                            "gradient_checkpointing",
                                            "id2label",
                                            "initializer_range",
                                            "label2id",
                                            "name",
                                            "output_past",
                                            "pad_token_id",
                                            "predict_special_tokens",
                                            "resid_pdrop",
                                            "summary_activation",
                                            "summary_first_dropout",
                                            "summary_proj_to_labels",
                                            "summary_type",
                                            "summary_use_proj",
                                            "task_specific_params",
                                            "torch_dtype",
                                            "transformers_version",
                                            "use_cache"};

const char* const kSizeKeys[] = {"n_layer",    "n_head",      "n_embd", "vocab_size",
                                 "block_size", "n_positions", "n_ctx"};
// Three names for the context length: nanoGPT's, Hugging Face's, and its legacy one.
const char* const kContextKeys[] = {"block_size", "n_positions", "n_ctx"};

}  // namespace

ModelSpec gpt2_spec_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) bad_spec(origin, "must be a JSON object");
  std::vector<std::string> unknown;
  for (const auto& item : j.items()) {
    // A named key, not a structured binding: clang before 16 cannot capture those.
    const std::string& k = item.key();
    const bool fixed = std::any_of(std::begin(kFixedKeys), std::end(kFixedKeys),
                                   [&k](const FixedKey& f) { return k == f.key; });
    const bool size = std::any_of(std::begin(kSizeKeys), std::end(kSizeKeys),
                                  [&k](const char* s) { return k == s; });
    if (!fixed && !size && !kIgnoredKeys.count(k)) unknown.push_back(k);
  }
  if (!unknown.empty()) {
    bad_spec(origin,
             "unknown key(s): " + join(unknown) +
                 " (expected n_layer, n_head, n_embd, vocab_size, block_size or n_positions, "
                 "and Hugging Face GPT-2 / nanoGPT config keys; docs/reliability.md lists "
                 "them)");
  }
  for (const char* k : {"n_layer", "n_head", "n_embd", "vocab_size"}) {
    if (!j.contains(k)) bad_spec(origin, std::string("missing key '") + k + "'");
  }
  const char* context = nullptr;
  for (const char* k : kContextKeys) {
    if (!j.contains(k)) continue;
    if (context && j[k] != j[context]) {
      bad_spec(origin, std::string(context) + " = " + j[context].dump() + " and " + k + " = " +
                           j[k].dump() + " disagree; give one of them");
    }
    if (!context) context = k;
  }
  if (!context) bad_spec(origin, "missing key 'block_size' (or 'n_positions')");
  ModelSpec s;
  s.name = spec_name(j, origin);
  s.n_layer = positive_int(j, "n_layer", origin);
  s.n_head = positive_int(j, "n_head", origin);
  s.n_embd = positive_int(j, "n_embd", origin);
  s.vocab_size = positive_int(j, "vocab_size", origin);
  s.block_size = positive_int(j, context, origin);
  for (const FixedKey& f : kFixedKeys) {
    if (j.contains(f.key) && !f.ok(j[f.key], j)) {
      bad_spec(origin, std::string(f.key) + " = " + j[f.key].dump() +
                           " is not supported: this GPT-2 implements " + f.key + " = " +
                           f.supported + "; use a config of that architecture");
    }
  }
  s.validate();
  return s;
}

}  // namespace zo::model::detail
