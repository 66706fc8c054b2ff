// Hugging Face weights (GPT-2 and the Llama family) in safetensors: import (to initialise or
// fine-tune) and export (fp32/fp16/bf16; one file, or a model directory with config.json and
// sharded weights) with the tensor names and shapes transformers uses, so the files load there.
// HF GPT-2 keeps Linear weights as Conv1D, (in, out): those are transposed on the way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/dtype.h"
#include "model/layout.h"

namespace zo::model {

// Shape of tensor t in Hugging Face's convention.
std::vector<std::uint64_t> hf_shape(const TensorInfo& t);
// Element i of tensor t (our row-major order) as its index in the file's shape, "[3, 77]", so
// that a message points at what a user sees in a checkpoint or export (Conv1D weights are
// stored transposed).
std::string hf_index(const TensorInfo& t, std::size_t i);

// Copies between our layout (row-major (out, in)) and HF's (transposed for Conv1D weights):
// to_hf writes elements [first, first + n) of tensor t in HF order from `ours`, the whole tensor
// in our order; from_hf converts a whole tensor.
template <class T>
void to_hf(const TensorInfo& t, const T* ours, std::uint64_t first, std::size_t n, T* hf);
template <class T>
void from_hf(const TensorInfo& t, const T* hf, T* ours);

// The index in our order of element k (in HF order) of tensor t.
inline std::size_t ours_index(const TensorInfo& t, std::uint64_t k) {
  if (!t.hf_transposed) return static_cast<std::size_t>(k);
  const std::size_t rows = t.shape[0], cols = t.shape[1];  // HF (cols, rows): k = c * rows + r
  return static_cast<std::size_t>(k % rows) * cols + static_cast<std::size_t>(k / rows);
}

// Elements of tensor t in Hugging Face order from a reader of our layout by range (an optimizer
// state on a drive, which has no whole array): a direct tensor piece by piece; a transposed (GPT-2
// Conv1D) one read whole once and kept until the next tensor (at most 4 C^2 values).
template <class T>
class RangedHfReader {
 public:
  // read(offset, n, out): layout elements [offset, offset + n) into out.
  using Read = std::function<void(std::size_t offset, std::size_t n, T* out)>;
  explicit RangedHfReader(Read read) : read_(std::move(read)) {}
  // Elements [first, first + n) of t in HF order into hf.
  void operator()(const TensorInfo& t, std::uint64_t first, std::size_t n, T* hf) {
    if (!t.hf_transposed) {
      read_(t.offset + static_cast<std::size_t>(first), n, hf);
      return;
    }
    if (cached_ != &t) {
      cache_.resize(t.numel);
      read_(t.offset, t.numel, cache_.data());
      cached_ = &t;
    }
    to_hf(t, cache_.data(), first, n, hf);
  }

 private:
  Read read_;
  std::vector<T> cache_;
  const TensorInfo* cached_ = nullptr;
};

// Elements [first, first + out.size()) of tensor t in Hugging Face order, as fp32: what an
// export or a checkpoint writes, read piece by piece so that no copy of the model is made.
using HfSource =
    std::function<void(const TensorInfo& t, std::uint64_t first, std::span<float> out)>;
// The values of `params` (layout.size(), our order), which must outlive the source.
HfSource hf_source(std::span<const float> params);

// Takes imported values in our layout's order: elements [offset, offset + values.size()) of the
// layout (a piece of one tensor).
using ParamSink = std::function<void(std::size_t offset, std::span<const float> values)>;

// Largest piece import_hf_weights hands its sink at once, and what it holds besides: 4 MiB of
// fp32, or a whole transposed (GPT-2 Conv1D) tensor twice.
inline constexpr std::size_t kImportPieceElements = std::size_t{1} << 20;

// Reads every parameter of `layout` from a .safetensors file, a sharded set's
// model.safetensors.index.json, or a directory holding either (ckpt::SafetensorsSet checks the
// index against its shards), and gives them to `sink` piece by piece (kImportPieceElements).
// F32, F16 and BF16 tensors. Names may carry a "transformer." prefix (but not both forms of one
// name); HF's buffers ("attn.bias", "attn.masked_bias", "rotary_emb.inv_freq") are skipped. A
// tied model's "lm_head.weight", if present, must equal the embedding; an untied one's is
// required like any parameter. Throws CheckpointError listing missing, unexpected, repeated or
// mis-shaped tensors, or an untied LM head, before the sink is called; a read that fails later
// (a file truncated meanwhile) leaves what the sink received so far.
void import_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       const ParamSink& sink);
// The same into params (layout.size() fp32).
void import_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       std::span<float> params);

// The config.json beside Hugging Face weights (`path` as import_hf_weights takes it): inside a
// directory, or next to a file; nullopt when there is none. Training and sampling take the model
// from it when --model is not given.
std::optional<std::filesystem::path> hf_config_beside(const std::filesystem::path& path);

// Tensor t's data as `dtype` from `source` (copied; what it reads, and t, must outlive the
// write), for SafetensorsWriter::add_filled.
ckpt::SafetensorsWriter::Fill hf_fill(const TensorInfo& t, const HfSource& source, DType dtype);

// Adds every parameter to `writer` in HF names/shapes, stored as `dtype`, read from `source` as
// the file streams (what the source reads, and the layout, must outlive the write).
void add_hf_weights(ckpt::SafetensorsWriter& writer, const ParameterLayout& layout,
                    const HfSource& source, DType dtype);

// Writes the weights as a standalone HF safetensors file (atomic).
void export_hf_weights(const std::filesystem::path& path, const ParameterLayout& layout,
                       const HfSource& source, DType dtype);

// The config.json transformers loads the model from: GPT2LMHeadModel's for GPT-2, the spec's own
// (ModelSpec::to_json without "name") for the Llama family; "torch_dtype" names `dtype`.
nlohmann::json hf_config(const ModelSpec& spec, DType dtype);

// transformers' save_pretrained default: shards of at most 5 GB of tensor data.
inline constexpr std::uint64_t kDefaultShardBytes = 5'000'000'000;

// The owner in the writer record of an export's staging folder (ckpt::remove_abandoned_saves).
inline constexpr const char* kExportOwner = "export";

// Writes a Hugging Face model directory (made if missing): config.json, and the weights as one
// model.safetensors when their data fits in max_shard_bytes, else model-0000k-of-0000n.safetensors
// (tensors in layout order, none split; ckpt::plan_shards) and model.safetensors.index.json. All
// are written whole into a hidden staging folder inside `dir` first, so that a failure (a full
// disk) leaves a previous export there as it was and removes the directories made; then they
// replace the previous export's (ckpt::replace_files: its index first, the new index last, all
// undone if a rename fails), and its model.safetensors or shards that are not part of the new set
// are removed; other files are left alone. Returns the file names written, in order.
std::vector<std::string> export_hf_directory(const std::filesystem::path& dir,
                                             const ParameterLayout& layout, const HfSource& source,
                                             DType dtype,
                                             std::uint64_t max_shard_bytes = kDefaultShardBytes);

}  // namespace zo::model
