#include "model/spec.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <set>
#include <stdexcept>
#include <tuple>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "core/error.h"

namespace zo::model {
namespace {

struct Preset {
  const char* name;
  int n_layer, n_head, n_embd, vocab_size, block_size;
};

// GPT-2 sizes from the GPT-2 paper / Hugging Face configs; tiny ones for tests and the demo.
constexpr Preset kPresets[] = {
    {"tiny", 2, 2, 64, 256, 64},          // byte-level, seconds per step on one core
    {"small-test", 4, 4, 128, 512, 128},  // host benchmark "small" config
    {"gpt2-124m", 12, 12, 768, 50257, 1024},
    {"gpt2-350m", 24, 16, 1024, 50257, 1024},
    {"gpt2-774m", 36, 20, 1280, 50257, 1024},
    {"gpt2-1558m", 48, 25, 1600, 50257, 1024},
    // Larger GPT-2-shaped models for offload planning (GPT-3 paper Table 2.1 widths).
    {"gpt-2.7b", 32, 32, 2560, 50257, 2048},
    {"gpt-6.7b", 32, 32, 4096, 50257, 2048},
    {"gpt-13b", 40, 40, 5120, 50257, 2048},
};

// Real configs are a few KB; anything this large is not one.
constexpr std::uint64_t kMaxSpecBytes = 16u << 20;

[[noreturn]] void bad(const std::string& origin, const std::string& what) {
  throw std::invalid_argument("model spec " + origin + ": " + what);
}

int get_int(const nlohmann::json& j, const char* key, const std::string& origin) {
  const auto& v = j.at(key);
  if (!v.is_number_integer())
    bad(origin, std::string(key) + " must be an integer, got " + v.dump());
  const auto x = v.get<std::int64_t>();
  if (x <= 0 || x > (1 << 30)) {
    bad(origin, std::string(key) + " = " + std::to_string(x) + " is out of range (1 .. 2^30)");
  }
  return static_cast<int>(x);
}

}  // namespace

void ModelSpec::validate() const {
  const std::string origin = "'" + name + "'";
  for (auto [key, v] : {std::pair{"n_layer", n_layer},
                        {"n_head", n_head},
                        {"n_embd", n_embd},
                        {"vocab_size", vocab_size},
                        {"block_size", block_size}}) {
    if (v <= 0) bad(origin, std::string(key) + " = " + std::to_string(v) + " must be > 0");
  }
  if (n_embd % n_head != 0) {
    bad(origin, "n_embd = " + std::to_string(n_embd) + " is not divisible by n_head = " +
                    std::to_string(n_head) + "; choose n_head dividing n_embd (head size " +
                    "n_embd / n_head, commonly 64)");
  }
  // Bounds far above any model a machine can train, so that every size below is exact in
  // size_t and a hostile spec is refused here rather than after minutes of layout building.
  for (auto [key, v, max] : {std::tuple{"n_layer", n_layer, kMaxLayers},
                             {"n_embd", n_embd, kMaxEmbd},
                             {"vocab_size", vocab_size, kMaxVocab},
                             {"block_size", block_size, kMaxBlock}}) {
    if (v > max) {
      bad(origin, std::string(key) + " = " + std::to_string(v) + " is above the supported " +
                      std::to_string(max));
    }
  }
  if (const std::size_t n = num_parameters(); n > kMaxParameters) {
    char text[64];
    std::snprintf(text, sizeof text, "%.3g parameters, above the supported %.3g", double(n),
                  double(kMaxParameters));
    bad(origin, std::string("the model has ") + text);
  }
}

std::size_t ModelSpec::num_parameters() const {
  const std::size_t C = n_embd, L = n_layer;
  // wte + wpe + per layer (2 LN + qkv + proj + fc + fc proj) + final LN; lm head tied to wte.
  return std::size_t(vocab_size) * C + std::size_t(block_size) * C +
         L * (4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)) +
         2 * C;
}

nlohmann::json ModelSpec::to_json() const {
  return {{"n_layer", n_layer},       {"n_head", n_head},         {"n_embd", n_embd},
          {"vocab_size", vocab_size}, {"block_size", block_size}, {"name", name}};
}

bool ModelSpec::same_architecture(const ModelSpec& o) const {
  return n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd &&
         vocab_size == o.vocab_size && block_size == o.block_size;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets)
    out.emplace_back(p.name);
  return out;
}

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

ModelSpec model_spec_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) bad(origin, "must be a JSON object");
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
    std::string list;
    for (const auto& k : unknown)
      list += (list.empty() ? "" : ", ") + k;
    bad(origin, "unknown key(s): " + list +
                    " (expected n_layer, n_head, n_embd, vocab_size, block_size or n_positions, "
                    "and Hugging Face GPT-2 / nanoGPT config keys; docs/reliability.md lists "
                    "them)");
  }
  for (const char* k : {"n_layer", "n_head", "n_embd", "vocab_size"}) {
    if (!j.contains(k)) bad(origin, std::string("missing key '") + k + "'");
  }
  const char* context = nullptr;
  for (const char* k : kContextKeys) {
    if (!j.contains(k)) continue;
    if (context && j[k] != j[context]) {
      bad(origin, std::string(context) + " = " + j[context].dump() + " and " + k + " = " +
                      j[k].dump() + " disagree; give one of them");
    }
    if (!context) context = k;
  }
  if (!context) bad(origin, "missing key 'block_size' (or 'n_positions')");
  ModelSpec s;
  if (j.contains("name") && !j["name"].is_string()) {
    bad(origin, "name must be a string, got " + j["name"].dump());
  }
  s.name = j.contains("name") ? j["name"].get<std::string>() : origin;
  s.n_layer = get_int(j, "n_layer", origin);
  s.n_head = get_int(j, "n_head", origin);
  s.n_embd = get_int(j, "n_embd", origin);
  s.vocab_size = get_int(j, "vocab_size", origin);
  s.block_size = get_int(j, context, origin);
  for (const FixedKey& f : kFixedKeys) {
    if (j.contains(f.key) && !f.ok(j[f.key], j)) {
      bad(origin, std::string(f.key) + " = " + j[f.key].dump() +
                      " is not supported: this GPT-2 implements " + f.key + " = " + f.supported +
                      "; use a config of that architecture");
    }
  }
  s.validate();
  return s;
}

ModelSpec load_model_spec(const std::string& preset_or_path) {
  for (const auto& p : kPresets) {
    if (preset_or_path == p.name) {
      ModelSpec s{p.name, p.n_layer, p.n_head, p.n_embd, p.vocab_size, p.block_size};
      s.validate();
      return s;
    }
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::status(preset_or_path, ec))) {
    std::string names;
    for (const auto& n : preset_names())
      names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument(
        "--model '" + preset_or_path +
        "' is neither a preset nor a readable JSON file; presets: " + names);
  }
  nlohmann::json j;
  try {
    j = ckpt::parse_json(ckpt::read_file(preset_or_path, kMaxSpecBytes));
  } catch (const CheckpointError& e) {
    throw std::invalid_argument("--model: " + std::string(e.what()) +
                                " Give a preset name or a JSON spec file.");
  } catch (const ckpt::JsonError& e) {
    throw std::invalid_argument("model spec '" + preset_or_path +
                                "' is not valid JSON: " + e.what());
  }
  return model_spec_from_json(j, "'" + preset_or_path + "'");
}

}  // namespace zo::model
