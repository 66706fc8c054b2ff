// What the spec's readers share (spec.cpp, spec_gpt2.cpp, spec_llama.cpp): errors naming the
// origin, integer keys in range, and the two config dialects.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "model/spec.h"

namespace zo::model::detail {

[[noreturn]] void bad_spec(const std::string& origin, const std::string& what);
// The largest value of an integer key that ModelSpec::validate admits (kMaxLayers for n_layer,
// ...); 2^30 for a key it does not bound.
long long key_limit(std::string_view key);
// j[key] as an int in 1 .. key_limit(key), or an error naming the key and that range.
int positive_int(const nlohmann::json& j, const char* key, const std::string& origin);
// j[key] as a finite number, or an error naming the key.
double finite_number(const nlohmann::json& j, const char* key, const std::string& origin);
// j["name"] if given (a string), else origin without the quotes around a spec file's path.
std::string spec_name(const nlohmann::json& j, const std::string& origin);
// "a, b, c"
std::string join(const std::vector<std::string>& items);

// Our GPT-2 keys, or a Hugging Face / nanoGPT GPT-2 config (model_type absent or "gpt2").
ModelSpec gpt2_spec_from_json(const nlohmann::json& j, const std::string& origin);
// A Hugging Face config.json of model_type llama, mistral or qwen2.
ModelSpec llama_spec_from_json(const nlohmann::json& j, const std::string& origin);
nlohmann::json llama_spec_to_json(const ModelSpec& s);

}  // namespace zo::model::detail
