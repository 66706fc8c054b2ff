// GPT-2 architecture hyperparameters: from a JSON file with GPT-2 key names or a named preset.
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
inline constexpr std::size_t kMaxParameters = std::size_t{1} << 42;  // 4.4e12

struct ModelSpec {
  std::string name;  // preset name or the file it came from
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;      // C
  int vocab_size = 0;  // V
  int block_size = 0;  // maximum sequence length (n_positions)

  void validate() const;  // throws std::invalid_argument naming the field and the fix
  std::size_t num_parameters() const;
  nlohmann::json to_json() const;  // GPT-2 key names
  bool same_architecture(const ModelSpec& o) const;
};

// "gpt2-124m" etc., or a path to a .json file. Throws with the list of presets when neither.
ModelSpec load_model_spec(const std::string& preset_or_path);
ModelSpec model_spec_from_json(const nlohmann::json& j, const std::string& origin);
std::vector<std::string> preset_names();

}  // namespace zo::model
