#include "model/spec.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <utility>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "core/error.h"
#include "model/spec_internal.h"

namespace zo::model {
namespace detail {

void bad_spec(const std::string& origin, const std::string& what) {
  throw std::invalid_argument("model spec " + origin + ": " + what);
}

long long key_limit(std::string_view key) {
  for (const auto& [k, limit] : std::initializer_list<std::pair<std::string_view, long long>>{
           {"n_layer", kMaxLayers},
           {"num_hidden_layers", kMaxLayers},
           {"n_embd", kMaxEmbd},
           {"hidden_size", kMaxEmbd},
           {"n_head", kMaxEmbd},
           {"num_attention_heads", kMaxEmbd},
           {"num_key_value_heads", kMaxEmbd},
           {"vocab_size", kMaxVocab},
           {"block_size", kMaxBlock},
           {"n_positions", kMaxBlock},
           {"n_ctx", kMaxBlock},
           {"max_position_embeddings", kMaxBlock},
           {"head_dim", kMaxHeadDim},
           {"intermediate_size", kMaxIntermediate}}) {
    if (k == key) return limit;
  }
  return 1 << 30;
}

int positive_int(const nlohmann::json& j, const char* key, const std::string& origin) {
  const auto& v = j.at(key);
  if (!v.is_number_integer())
    bad_spec(origin, std::string(key) + " must be an integer, got " + v.dump());
  // Above 2^63 as the largest int64 (get<std::int64_t> would wrap it negative).
  const auto x = v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX
                     ? INT64_MAX
                     : v.get<std::int64_t>();
  const long long limit = key_limit(key);
  if (x <= 0) {
    bad_spec(origin, std::string(key) + " = " + v.dump() + " is out of range (1 .. " +
                         std::to_string(limit) + ")");
  }
  if (x > limit) {  // as ModelSpec::validate says it
    bad_spec(origin, std::string(key) + " = " + v.dump() + " is above the supported " +
                         std::to_string(limit));
  }
  return static_cast<int>(x);
}

double finite_number(const nlohmann::json& j, const char* key, const std::string& origin) {
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    bad_spec(origin, std::string(key) + " must be a finite number, got " + v.dump());
  return v.get<double>();
}

std::string spec_name(const nlohmann::json& j, const std::string& origin) {
  if (!j.contains("name")) {
    // A spec file's origin is its quoted path: the name is the path (messages quote it again).
    const bool quoted = origin.size() >= 2 && origin.front() == '\'' && origin.back() == '\'';
    return quoted ? origin.substr(1, origin.size() - 2) : origin;
  }
  if (!j["name"].is_string()) bad_spec(origin, "name must be a string, got " + j["name"].dump());
  return j["name"].get<std::string>();
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace detail

namespace {

using detail::bad_spec;

// Real configs are a few KB; anything this large is not one.
constexpr std::uint64_t kMaxSpecBytes = 16u << 20;

struct Gpt2Preset {
  const char* name;
  int n_layer, n_head, n_embd, vocab_size, block_size;
};

// GPT-2 sizes from the GPT-2 paper / Hugging Face configs; tiny ones for tests and the demo.
constexpr Gpt2Preset kGpt2Presets[] = {
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

// The published Hugging Face config.json of each model (the keys that shape the computation).
const nlohmann::json& llama_presets() {
  static const nlohmann::json presets = [] {
    const nlohmann::json llama3_rope = {{"rope_type", "llama3"},
                                        {"factor", 32.0},
                                        {"low_freq_factor", 1.0},
                                        {"high_freq_factor", 4.0},
                                        {"original_max_position_embeddings", 8192}};
    nlohmann::json llama31_rope = llama3_rope;
    llama31_rope["factor"] = 8.0;
    auto llama = [](int L, int C, int H, int KV, int I, int V, int ctx, double theta, double eps,
                    bool tie, const nlohmann::json& rope) {
      return nlohmann::json{
          {"model_type", "llama"},    {"num_hidden_layers", L},         {"hidden_size", C},
          {"num_attention_heads", H}, {"num_key_value_heads", KV},      {"intermediate_size", I},
          {"vocab_size", V},          {"max_position_embeddings", ctx}, {"rope_theta", theta},
          {"rms_norm_eps", eps},      {"tie_word_embeddings", tie},     {"rope_scaling", rope}};
    };
    nlohmann::json p;
    // A byte-level Llama with GQA for tests and demos, and a Qwen2-shaped one (q/k/v biases).
    p["tiny-llama"] = llama(2, 64, 4, 2, 96, 256, 128, 10000.0, 1e-5, false, nullptr);
    p["tiny-qwen2"] = llama(2, 64, 4, 1, 96, 256, 128, 1e6, 1e-6, true, nullptr);
    p["tiny-qwen2"]["model_type"] = "qwen2";
    p["llama3.2-1b"] = llama(16, 2048, 32, 8, 8192, 128256, 131072, 5e5, 1e-5, true, llama3_rope);
    p["llama3.2-3b"] = llama(28, 3072, 24, 8, 8192, 128256, 131072, 5e5, 1e-5, true, llama3_rope);
    p["llama3.1-8b"] =
        llama(32, 4096, 32, 8, 14336, 128256, 131072, 5e5, 1e-5, false, llama31_rope);
    p["qwen2.5-0.5b"] = llama(24, 896, 14, 2, 4864, 151936, 32768, 1e6, 1e-6, true, nullptr);
    p["qwen2.5-0.5b"]["model_type"] = "qwen2";
    p["qwen2.5-1.5b"] = llama(28, 1536, 12, 2, 8960, 151936, 32768, 1e6, 1e-6, true, nullptr);
    p["qwen2.5-1.5b"]["model_type"] = "qwen2";
    p["mistral-7b"] = llama(32, 4096, 32, 8, 14336, 32768, 32768, 1e6, 1e-5, false, nullptr);
    p["mistral-7b"]["model_type"] = "mistral";
    return p;
  }();
  return presets;
}

void check_positive(const std::string& origin, const char* key, long long v) {
  if (v <= 0) bad_spec(origin, std::string(key) + " = " + std::to_string(v) + " must be > 0");
}

void check_at_most(const std::string& origin, const char* key, long long v, long long max) {
  if (v > max) {
    bad_spec(origin, std::string(key) + " = " + std::to_string(v) + " is above the supported " +
                         std::to_string(max));
  }
}

void validate_llama(const ModelSpec& s, const std::string& origin) {
  check_positive(origin, "num_key_value_heads", s.n_kv_head);
  check_positive(origin, "head_dim", s.head_dim);
  check_positive(origin, "intermediate_size", s.intermediate_size);
  if (s.n_kv_head > s.n_head || s.n_head % s.n_kv_head != 0) {
    bad_spec(origin, "num_key_value_heads = " + std::to_string(s.n_kv_head) +
                         " must divide num_attention_heads = " + std::to_string(s.n_head) +
                         " (each kv head serves the same number of query heads)");
  }
  if (s.head_dim % 2 != 0) {
    bad_spec(origin, "head_dim = " + std::to_string(s.head_dim) +
                         " must be even (rotary embeddings rotate pairs of the two halves)");
  }
  check_at_most(origin, "head_dim", s.head_dim, kMaxHeadDim);
  check_at_most(origin, "intermediate_size", s.intermediate_size, kMaxIntermediate);
  if (!(s.norm_eps > 0.0 && s.norm_eps < 1.0))
    bad_spec(origin, "rms_norm_eps = " + std::to_string(s.norm_eps) + " must be in (0, 1)");
  if (!(s.rope_theta > 1.0 && std::isfinite(s.rope_theta)))
    bad_spec(origin, "rope_theta = " + std::to_string(s.rope_theta) + " must be > 1");
  if (!(s.init_std > 0.0 && s.init_std < 1.0))
    bad_spec(origin, "initializer_range = " + std::to_string(s.init_std) + " must be in (0, 1)");
  const RopeScaling& r = s.rope_scaling;
  if (r.llama3 &&
      !(r.factor >= 1.0 && r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor &&
        r.original_max_position_embeddings > 0)) {
    bad_spec(origin,
             "rope_scaling (llama3) needs factor >= 1, 0 < low_freq_factor < high_freq_factor "
             "and original_max_position_embeddings > 0");
  }
}

}  // namespace

void ModelSpec::validate() const {
  const std::string origin = "'" + name + "'";
  const bool l = llama();
  check_positive(origin, l ? "num_hidden_layers" : "n_layer", n_layer);
  check_positive(origin, l ? "num_attention_heads" : "n_head", n_head);
  check_positive(origin, l ? "hidden_size" : "n_embd", n_embd);
  check_positive(origin, "vocab_size", vocab_size);
  check_positive(origin, l ? "max_position_embeddings" : "block_size", block_size);
  if (!l && n_embd % n_head != 0) {
    bad_spec(origin, "n_embd = " + std::to_string(n_embd) + " is not divisible by n_head = " +
                         std::to_string(n_head) + "; choose n_head dividing n_embd (head size " +
                         "n_embd / n_head, commonly 64)");
  }
  // Bounds far above any model a machine can train, so that every size below is exact in
  // size_t and a hostile spec is refused here rather than after minutes of layout building.
  check_at_most(origin, l ? "num_hidden_layers" : "n_layer", n_layer, kMaxLayers);
  check_at_most(origin, l ? "hidden_size" : "n_embd", n_embd, kMaxEmbd);
  check_at_most(origin, l ? "num_attention_heads" : "n_head", n_head, kMaxEmbd);
  check_at_most(origin, "vocab_size", vocab_size, kMaxVocab);
  check_at_most(origin, l ? "max_position_embeddings" : "block_size", block_size, kMaxBlock);
  if (l) validate_llama(*this, origin);
  if (const std::size_t n = num_parameters(); n > kMaxParameters) {
    char text[64];
    std::snprintf(text, sizeof text, "%.3g parameters, above the supported %.3g", double(n),
                  double(kMaxParameters));
    bad_spec(origin, std::string("the model has ") + text);
  }
}

std::size_t ModelSpec::num_parameters() const {
  const std::size_t C = n_embd, L = n_layer, V = vocab_size;
  if (!llama()) {
    // wte + wpe + per layer (2 LN + qkv + proj + fc + fc proj) + final LN; lm head tied to wte.
    return V * C + std::size_t(block_size) * C +
           L * (4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)) +
           2 * C;
  }
  const std::size_t QKV = qkv_width(), Q = std::size_t(n_head) * head_dim;
  const std::size_t I = intermediate_size;
  // Per layer: 2 RMSNorm weights, q|k|v (+ biases), o (+ bias), gate, up, down.
  const std::size_t layer =
      2 * C + QKV * C + (qkv_bias ? QKV : 0) + Q * C + (o_bias ? C : 0) + 3 * I * C;
  return V * C + L * layer + C + (tie_word_embeddings ? 0 : V * C);
}

nlohmann::json ModelSpec::to_json() const {
  if (llama()) return detail::llama_spec_to_json(*this);
  return {{"n_layer", n_layer},       {"n_head", n_head},         {"n_embd", n_embd},
          {"vocab_size", vocab_size}, {"block_size", block_size}, {"name", name}};
}

bool ModelSpec::same_architecture(const ModelSpec& o) const {
  nlohmann::json a = to_json(), b = o.to_json();
  a.erase("name");
  b.erase("name");
  return a == b;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kGpt2Presets)
    out.emplace_back(p.name);
  for (const auto& item : llama_presets().items())
    out.push_back(item.key());
  return out;
}

ModelSpec model_spec_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) bad_spec(origin, "must be a JSON object");
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    return detail::llama_spec_from_json(j, origin);
  return detail::gpt2_spec_from_json(j, origin);
}

ModelSpec load_model_spec(const std::string& preset_or_path) {
  for (const auto& p : kGpt2Presets) {
    if (preset_or_path == p.name) {
      ModelSpec s;
      s.name = p.name;
      std::tie(s.n_layer, s.n_head, s.n_embd, s.vocab_size, s.block_size) =
          std::tuple{p.n_layer, p.n_head, p.n_embd, p.vocab_size, p.block_size};
      s.validate();
      return s;
    }
  }
  if (const auto& presets = llama_presets(); presets.contains(preset_or_path)) {
    nlohmann::json j = presets[preset_or_path];
    j["name"] = preset_or_path;
    return model_spec_from_json(j, "'" + preset_or_path + "'");
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::status(preset_or_path, ec))) {
    throw std::invalid_argument(
        "--model '" + preset_or_path +
        "' is neither a preset nor a readable JSON file; presets: " + detail::join(preset_names()));
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
