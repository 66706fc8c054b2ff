// The inverse frequencies of rotary position embeddings (RoFormer, arXiv 2104.09864), the table
// Device::rope_forward and rope_backward read: inv_freq[i] = theta^(-2i / hs) for i < hs / 2,
// optionally rescaled as Llama 3.1 does for long contexts (Hugging Face config
// `rope_scaling: {rope_type: llama3, ...}`; formula as transformers' modeling_rope_utils.py,
// the llama3 rope type). Computed once on the host in double and rounded to fp32.
#pragma once

#include <vector>

#include "model/spec.h"

namespace zo::model {

struct RopeConfig {
  int head_size = 0;         // hs: even
  double theta = 1e4;        // `rope_theta` (Llama 2: 1e4, Llama 3: 5e5)
  RopeScaling scaling = {};  // spec.h; scaling.llama3 false: plain RoPE
};

// hs / 2 values; throws std::invalid_argument for an odd or non-positive head size, theta <= 1,
// or a llama3 scaling with factor < 1, high_freq_factor <= low_freq_factor, low_freq_factor <= 0
// or original_max_position_embeddings <= 0.
std::vector<float> rope_inv_freq(const RopeConfig& c);

}  // namespace zo::model
