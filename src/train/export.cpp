#include "train/export.h"

#include <filesystem>
#include <span>
#include <stdexcept>
#include <system_error>

#include "checkpoint/safetensors.h"
#include "core/bytes.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "model/layout.h"
#include "train/checkpoint_io.h"
#include "train/finite_weights.h"
#include "train/run_outputs.h"

namespace zo::train {
namespace fs = std::filesystem;

namespace {

// Refuses what would damage a file or directory the user has, before any work.
void check_directory_output(const fs::path& dir, bool force) {
  refuse_inside_checkpoint(dir / "config.json", "--out");  // dir itself may be a checkpoint
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) return;
  if (!fs::is_directory(st)) {
    throw CheckpointError("--out '" + dir.string() +
                          "' exists and is not a directory; a path not ending in .safetensors "
                          "is written as a Hugging Face model directory. Choose another path");
  }
  if (!force && !fs::is_empty(dir, ec)) {
    throw CheckpointError("--out '" + dir.string() +
                          "' is a directory that is not empty; pass --force to write into it "
                          "(config.json, model*.safetensors and the index of a previous export "
                          "are replaced, other files are kept), or choose a new directory");
  }
}

// Reads the checkpoint's weights once, checking their names and shapes against the layout:
// the first weight that is not finite, or would not be once stored in `dtype` (fp16 overflows
// above 65504), as "<tensor> [i] = <value>"; "" when all are.
std::string find_unexportable(const fs::path& weights, const model::ParameterLayout& layout,
                              DType dtype) {
  std::string found;
  model::import_hf_weights(weights, layout, [&](std::size_t offset, std::span<const float> v) {
    if (found.empty()) found = first_nonfinite_weight(layout, offset, v, dtype);
  });
  return found;
}

}  // namespace

std::string export_checkpoint(const ExportConfig& c) {
  const fs::path out = c.out;
  const bool one_file = out.extension() == ".safetensors";
  std::uint64_t shard_bytes = model::kDefaultShardBytes;
  if (!c.shard_size.empty()) {
    if (one_file) {
      throw std::invalid_argument("--shard-size applies to a directory output; -o " + c.out +
                                  " writes one .safetensors file (give a directory to shard)");
    }
    shard_bytes = parse_bytes(c.shard_size, "--shard-size");  // at least 1
  }
  if (one_file) {
    refuse_inside_checkpoint(out, "--out");  // even with --force
    if (!c.force && fs::exists(out)) {
      throw std::invalid_argument("'" + c.out + "' exists; pass --force to overwrite it");
    }
  } else {
    check_directory_output(out, c.force);
  }
  const auto dir = resolve_checkpoint(c.checkpoint, c.checkpoint_dir);
  const auto spec = checkpoint_spec(read_trainer_state(dir));
  const model::ParameterLayout layout(spec);
  const fs::path weights = dir / "model.safetensors";
  if (const std::string bad = find_unexportable(weights, layout, c.dtype);
      !bad.empty() && !c.allow_nonfinite) {
    throw CheckpointError("checkpoint '" + dir.string() +
                          "' holds weights that are not finite in " +
                          std::string(dtype_name(c.dtype)) + ": " + bad +
                          " (a diverged run?). Export an earlier checkpoint" +
                          (c.dtype == DType::kF16 ? ", use --dtype bf16 or fp32," : "") +
                          " or pass --allow-nonfinite to write them anyway");
  }
  // The checkpoint's tensors have the export's names and shapes: copied piece by piece.
  const auto file = ckpt::SafetensorsFile::open(weights);
  const model::HfSource source = [&file](const model::TensorInfo& t, std::uint64_t first,
                                         std::span<float> piece) {
    file.read_f32(t.name, piece, first);
  };
  const std::string what = std::to_string(layout.tensors().size()) + " tensors, " +
                           std::string(dtype_name(c.dtype)) + ", model " + spec.to_json().dump();
  if (one_file) {
    model::export_hf_weights(out, layout, source, c.dtype);
    return "wrote " + c.out + " (" + what + ")";
  }
  const auto files = model::export_hf_directory(out, layout, source, c.dtype, shard_bytes);
  std::string list;
  for (const auto& f : files)
    list += (list.empty() ? "" : ", ") + f;
  return "wrote " + c.out + "/: " + list + " (" + what + ")";
}

}  // namespace zo::train
