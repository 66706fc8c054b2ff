// Hugging Face GPT-2 weights in safetensors: import (to initialise or fine-tune) and export
// (fp32/fp16/bf16) with the tensor names and shapes transformers uses, so the files load there.
// HF GPT-2 keeps Linear weights as Conv1D, (in, out): those are transposed on the way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/layout.h"

namespace zo::ckpt {
class SafetensorsWriter;
}

namespace zo::model {

// Shape of tensor t in Hugging Face's convention.
std::vector<std::uint64_t> hf_shape(const TensorInfo& t);

// Copies between our layout (row-major (out, in)) and HF's (transposed for Conv1D weights).
template <class T>
void to_hf(const TensorInfo& t, const T* ours, T* hf);
template <class T>
void from_hf(const TensorInfo& t, const T* hf, T* ours);

// Reads every parameter of `layout` from a safetensors file into params (layout.size() fp32).
// Names may carry a "transformer." prefix (but not both forms of one name); HF's attention-mask
// buffers ("attn.bias", "attn.masked_bias") are skipped, and an "lm_head.weight" must equal wte
// (GPT-2 ties them). Throws CheckpointError listing missing, unexpected, repeated or mis-shaped
// tensors, or an untied LM head; params is untouched on error.
void import_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       std::span<float> params);

// Adds every parameter to `writer` in HF names/shapes, stored as `dtype`. The transposed copies
// live in `scratch`, which must outlive the write.
void add_hf_weights(ckpt::SafetensorsWriter& writer, const ParameterLayout& layout,
                    std::span<const float> params, DType dtype, std::vector<float>& scratch);

// Writes params as a standalone HF GPT-2 safetensors file (atomic).
void export_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       std::span<const float> params, DType dtype);

}  // namespace zo::model
