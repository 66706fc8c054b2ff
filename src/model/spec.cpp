#include "model/spec.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

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

ModelSpec model_spec_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) bad(origin, "must be a JSON object");
  // Keys of Hugging Face GPT-2 config.json files that do not change the architecture we build.
  static const std::set<std::string> kIgnored = {"activation_function",
                                                 "architectures",
                                                 "attn_pdrop",
                                                 "bos_token_id",
                                                 "embd_pdrop",
                                                 "eos_token_id",
                                                 "initializer_range",
                                                 "layer_norm_epsilon",
                                                 "model_type",
                                                 "n_ctx",
                                                 "n_inner",
                                                 "resid_pdrop",
                                                 "summary_activation",
                                                 "summary_first_dropout",
                                                 "summary_proj_to_labels",
                                                 "summary_type",
                                                 "summary_use_proj",
                                                 "task_specific_params",
                                                 "torch_dtype",
                                                 "transformers_version",
                                                 "use_cache",
                                                 "scale_attn_weights",
                                                 "reorder_and_upcast_attn",
                                                 "scale_attn_by_inverse_layer_idx",
                                                 "name",
                                                 "bias",
                                                 "dropout"};
  static const std::set<std::string> kKnown = {"n_layer",    "n_head",     "n_embd",
                                               "vocab_size", "block_size", "n_positions"};
  std::vector<std::string> unknown;
  for (const auto& [k, v] : j.items()) {
    if (!kKnown.count(k) && !kIgnored.count(k)) unknown.push_back(k);
  }
  if (!unknown.empty()) {
    std::string list;
    for (const auto& k : unknown)
      list += (list.empty() ? "" : ", ") + k;
    bad(origin, "unknown key(s): " + list +
                    " (expected n_layer, n_head, n_embd, vocab_size, block_size or n_positions)");
  }
  for (const char* k : {"n_layer", "n_head", "n_embd", "vocab_size"}) {
    if (!j.contains(k)) bad(origin, std::string("missing key '") + k + "'");
  }
  if (j.contains("block_size") && j.contains("n_positions") &&
      j["block_size"] != j["n_positions"]) {
    bad(origin, "block_size and n_positions disagree; give one of them");
  }
  if (!j.contains("block_size") && !j.contains("n_positions")) {
    bad(origin, "missing key 'block_size' (or 'n_positions')");
  }
  ModelSpec s;
  s.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : origin;
  s.n_layer = get_int(j, "n_layer", origin);
  s.n_head = get_int(j, "n_head", origin);
  s.n_embd = get_int(j, "n_embd", origin);
  s.vocab_size = get_int(j, "vocab_size", origin);
  s.block_size = get_int(j, j.contains("block_size") ? "block_size" : "n_positions", origin);
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
  if (!fs::is_regular_file(preset_or_path, ec)) {
    std::string names;
    for (const auto& n : preset_names())
      names += (names.empty() ? "" : ", ") + n;
    throw std::invalid_argument(
        "--model '" + preset_or_path +
        "' is neither a preset nor a readable JSON file; presets: " + names);
  }
  std::ifstream in(preset_or_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument("model spec '" + preset_or_path +
                                "' is not valid JSON: " + e.what());
  }
  return model_spec_from_json(j, "'" + preset_or_path + "'");
}

}  // namespace zo::model
