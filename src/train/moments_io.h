// Adam's m and v in checkpoint files, in every state format:
//   one process: optimizer.safetensors, exp_avg.<name> and exp_avg_sq.<name> in Hugging Face
//     shapes (F32 or BF16; q8: U8 codes, with exp_avg_absmax.<name> and exp_avg_sq_absmax.<name>,
//     the F32 maxima of the tensor's blocks of 2048 elements in the layout's order);
//   data parallel: optimizer.rank<r>-of<N>.safetensors, exp_avg and exp_avg_sq 1-D in the rank's
//     local order (q8: with exp_avg_absmax and exp_avg_sq_absmax over its segments: each tensor's
//     part in each of its ranges, as optim::HostOptimizer keeps them).
// Loading reads either form piece by piece as fp32 and stores it in the run's format: exact when
// the formats match (bf16 widens and rounds back; q8 re-quantizes a block it dequantized to the
// same codes and maximum when the blocks line up; other rank counts cut tensors elsewhere, and
// their blocks are quantized anew).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "model/layout.h"
#include "optim/host_optimizer.h"

namespace zo::train {

// The moments of a process that owns the whole layout.
void add_whole_moments(ckpt::SafetensorsWriter& w, const model::ParameterLayout& layout,
                       optim::HostOptimizer& opt);
// This rank's moments in its local order.
void add_shard_moments(ckpt::SafetensorsWriter& w, optim::HostOptimizer& opt);

// Reads the moments of checkpoint `dir` (trainer_state `state`: its optimizer_state_dtype and
// optimizer_shards) into opt's owned elements. The file's tensors are checked (names, shapes,
// dtypes) before any is read; throws CheckpointError naming the file.
void load_moments(const std::filesystem::path& dir, const nlohmann::json& state,
                  const model::ParameterLayout& layout, optim::HostOptimizer& opt);

}  // namespace zo::train
