// Weights in one safetensors file or sharded over several, as transformers' save_pretrained
// writes them: "model.safetensors", or "model-00001-of-00003.safetensors", ... beside
// "model.safetensors.index.json" = {"metadata": {"total_size": BYTES}, "weight_map": {tensor:
// file}}. Reading checks the index against the shards; writing plans the shards and the index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/safetensors.h"

namespace zo::ckpt {

inline constexpr std::string_view kSingleWeightsName = "model.safetensors";
inline constexpr std::string_view kWeightsIndexName = "model.safetensors.index.json";

// "model-00002-of-00005.safetensors" for k = 2, n = 5 (1-based, five digits as transformers).
std::string shard_file_name(std::size_t k, std::size_t n);
// Whether `name` is a file name of that form (any digit count).
bool is_shard_file_name(std::string_view name);

// The index's weight_map (tensor -> shard file). Throws CheckpointError naming `origin` when the
// text is not JSON, not an object, lacks a non-empty "weight_map" object of strings, has a
// "metadata" that is not an object, or names a file that is not a plain name beside the index
// ("../x", "a/b", "/abs": refused, nothing outside the directory is read).
std::map<std::string, std::string> parse_weights_index(std::string_view text,
                                                       const std::string& origin);

// The index transformers writes: keys sorted, indented by 2, ending in a newline.
std::string weights_index_json(std::uint64_t total_size,
                               const std::map<std::string, std::string>& weight_map);

// Cuts tensors of `bytes` each, kept in order, into shards of at most max_bytes: a shard ends
// where the next tensor would overflow it, and a tensor larger than max_bytes is alone in its
// shard (never split). Returns the index of each shard's first tensor; {} for no tensors.
std::vector<std::size_t> plan_shards(std::span<const std::uint64_t> bytes, std::uint64_t max_bytes);

// Every tensor of one safetensors file, or of the shards an index lists.
class SafetensorsSet {
 public:
  // `path` is a .safetensors file, an index (a name ending in ".json"), or a directory holding
  // model.safetensors or model.safetensors.index.json (not both). Sharded: every listed shard is
  // opened and validated; refused, naming the index and each problem: a listed tensor its shard
  // lacks, a tensor stored in a shard the index does not map it to (in two files, or unlisted),
  // and a model-NNNNN-of-NNNNN.safetensors beside the index that it does not list (left from
  // another save). Throws CheckpointError.
  // `max_header`: the largest header accepted in each file (safetensors_header_limit).
  static SafetensorsSet open(const std::filesystem::path& path,
                             std::uint64_t max_header = kMaxSafetensorsHeaderBytes);

  const std::filesystem::path& path() const { return path_; }          // the file or the index
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const TensorInfo& info(std::string_view name) const;                 // throws CheckpointError
  const SafetensorsFile& file_of(std::string_view name) const;
  // As SafetensorsFile::read_f32, from the tensor's shard (the whole tensor, or a range).
  void read_f32(std::string_view name, std::span<float> out) const;
  void read_f32(std::string_view name, std::span<float> out, std::uint64_t first) const;

 private:
  static SafetensorsSet open_index(const std::filesystem::path& index, std::uint64_t max_header);

  std::filesystem::path path_;
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> file_index_;  // tensor -> files_ index
};

}  // namespace zo::ckpt
