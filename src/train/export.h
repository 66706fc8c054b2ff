// `offload_train export`: a checkpoint's weights as Hugging Face safetensors, one file or a model
// directory, without ever touching a checkpoint or an existing output unasked.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace zo::train {

struct ExportConfig {
  std::string checkpoint;      // a checkpoint directory, or "latest"
  std::string checkpoint_dir;  // where "latest" is looked for
  // "X.safetensors": one file; any other path: a directory (config.json, weights, index).
  std::string out;
  DType dtype = DType::kF32;
  std::string shard_size;        // directory output only; "" = 5GB, as transformers
  bool force = false;            // replace the file, or write into a non-empty directory
  bool allow_nonfinite = false;  // write NaN/Inf (or fp16 overflow) instead of refusing
};

// Checks the output before reading the checkpoint (refused: a path inside a checkpoint, an
// existing file or non-empty directory without force, a file where a directory goes, a
// shard size with a file output), then writes it; weights that are not finite in the output
// dtype are refused, naming the first, unless allow_nonfinite. Returns one line saying what was
// written.
// Throws std::invalid_argument / CheckpointError naming the flag or file and the fix.
std::string export_checkpoint(const ExportConfig& c);

}  // namespace zo::train
