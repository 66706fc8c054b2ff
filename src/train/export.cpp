#include "train/export.h"

#include <filesystem>
#include <span>
#include <stdexcept>
#include <system_error>

#include "checkpoint/atomic_io.h"
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

// Refuses an output whose missing parent directories cannot be made: the nearest existing
// ancestor of `out` is not a directory. Makes nothing.
void check_parents_can_be_made(const fs::path& out) {
  std::error_code ec;
  for (fs::path a = out.parent_path(); !a.empty(); a = a.parent_path()) {
    const fs::file_status st = fs::status(a, ec);
    if (st.type() != fs::file_type::not_found) {
      if (ec || fs::is_directory(st)) return;  // unreadable: the write says why
      throw CheckpointError("-o '" + out.string() + "': '" + a.string() +
                            "' is not a directory, so the output cannot be made under it; "
                            "choose another -o");
    }
    if (a == a.parent_path()) return;
  }
}

// Refuses what would damage a file or directory the user has, before any work.
void check_directory_output(const fs::path& dir, bool force) {
  refuse_inside_checkpoint(dir / "config.json", "-o");  // dir itself may be a checkpoint
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) {
    check_parents_can_be_made(dir);
    return;
  }
  if (!fs::is_directory(st)) {
    throw CheckpointError("-o '" + dir.string() +
                          "' exists and is not a directory; a path not ending in .safetensors "
                          "is written as a Hugging Face model directory. Choose another -o");
  }
  // A killed export's staging folder, once its process is gone, does not make `dir` non-empty.
  ckpt::remove_abandoned_saves(dir, model::kExportOwner);
  if (!force && !fs::is_empty(dir, ec)) {
    throw CheckpointError("-o '" + dir.string() +
                          "' is a directory that is not empty; pass --force to write into it "
                          "(config.json, model*.safetensors and the index of a previous export "
                          "are replaced, other files are kept), or choose a new directory");
  }
}

// The same for one .safetensors file: not a directory (even with --force), not an existing file
// without --force, and its folder there or makeable.
void check_file_output(const fs::path& out, bool force) {
  refuse_inside_checkpoint(out, "-o");  // even with --force
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (fs::is_directory(st)) {
    throw CheckpointError("-o '" + out.string() +
                          "' is a directory; a path ending in .safetensors is written as one "
                          "file. Give a file path (e.g. " +
                          (out / "model.safetensors").string() +
                          "), or a path not ending in .safetensors for a model directory");
  }
  if (st.type() != fs::file_type::not_found) {
    if (!force) {
      throw CheckpointError("-o '" + out.string() + "' exists; pass --force to overwrite it");
    }
    return;
  }
  check_parents_can_be_made(out);
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
    check_file_output(out, c.force);
  } else {
    check_directory_output(out, c.force);
  }
  const auto dir = resolve_checkpoint(c.checkpoint, c.checkpoint_dir, "--checkpoint");
  const auto spec = checkpoint_spec(read_trainer_state(dir, CheckpointUse::kWeights));
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
  const auto file = ckpt::SafetensorsFile::open(
      weights, ckpt::safetensors_header_limit(4 * layout.tensors().size()));
  const model::HfSource source = [&file](const model::TensorInfo& t, std::uint64_t first,
                                         std::span<float> piece) {
    file.read_f32(t.name, piece, first);
  };
  const std::string what = std::to_string(layout.tensors().size()) + " tensors, " +
                           std::string(dtype_name(c.dtype)) + ", model " + spec.to_json().dump();
  if (one_file) {
    // Its folder, made only now that nothing is refused.
    ensure_writable_dir(out.parent_path().empty() ? fs::path(".") : out.parent_path(), "-o");
    model::export_hf_weights(out, layout, source, c.dtype);
    return "wrote " + c.out + " from " + dir.string() + " (" + what + ")";
  }
  const auto files = model::export_hf_directory(out, layout, source, c.dtype, shard_bytes);
  std::string list;
  for (const auto& f : files)
    list += (list.empty() ? "" : ", ") + f;
  return "wrote " + c.out + "/: " + list + " from " + dir.string() + " (" + what + ")";
}

}  // namespace zo::train
