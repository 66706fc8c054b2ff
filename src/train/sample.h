// Text/token generation from a trained model (offload_train sample).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zo::train {

struct SampleConfig {
  std::string checkpoint;  // checkpoint directory, or "latest" in checkpoint_dir
  std::string checkpoint_dir;
  std::string init_from;  // or Hugging Face GPT-2 safetensors + model
  std::string model;
  std::vector<std::int32_t> prompt;  // token ids (the CLI turns text into bytes)
  int new_tokens = 64;
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = all
  std::uint64_t seed = 1;
  int threads = 0;
};

// Returns the prompt followed by the generated tokens. Context beyond block_size slides.
std::vector<std::int32_t> generate(const SampleConfig& config, int* vocab_size = nullptr);

}  // namespace zo::train
