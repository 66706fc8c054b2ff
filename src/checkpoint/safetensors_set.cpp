// SafetensorsSet: one safetensors file, or the shards of an index checked against it.
#include "checkpoint/safetensors_set.h"

#include <algorithm>
#include <set>
#include <system_error>

#include "checkpoint/atomic_io_internal.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

namespace {

// An index lists a few thousand tensors at most (a few hundred KiB).
constexpr std::uint64_t kMaxIndexBytes = 64u << 20;

std::string join_some(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < 8; ++i)
    s += (i ? "; " : "") + v[i];
  if (v.size() > 8) s += "; ... (" + std::to_string(v.size()) + " problems in all)";
  return s;
}

// What a directory of Hugging Face weights holds: the file to open.
fs::path weights_in_directory(const fs::path& dir) {
  std::error_code ec;
  const bool single = fs::exists(dir / kSingleWeightsName, ec);
  const bool index = fs::exists(dir / kWeightsIndexName, ec);
  if (single && index) {
    throw CheckpointError("weights directory " + quoted(dir) + " holds both " +
                          std::string(kSingleWeightsName) + " and " +
                          std::string(kWeightsIndexName) +
                          ", so which weights are meant is unclear; move the stale one away, or "
                          "give the file itself");
  }
  if (!single && !index) {
    throw CheckpointError("weights directory " + quoted(dir) + " holds neither " +
                          std::string(kSingleWeightsName) + " nor " +
                          std::string(kWeightsIndexName) +
                          " (sharded weights); give the .safetensors file or the index itself");
  }
  return dir / (single ? kSingleWeightsName : kWeightsIndexName);
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const fs::path& path, std::uint64_t max_header) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return open(weights_in_directory(path), max_header);
  if (path.extension() == ".json") return open_index(path, max_header);
  SafetensorsSet s;
  s.path_ = path;
  s.files_.push_back(SafetensorsFile::open(path, max_header));
  s.tensors_ = s.files_[0].tensors();
  for (const TensorInfo& t : s.tensors_)
    s.file_index_.emplace(t.name, 0);
  return s;
}

SafetensorsSet SafetensorsSet::open_index(const fs::path& index, std::uint64_t max_header) {
  const std::string origin = quoted(index);
  const auto weight_map = parse_weights_index(read_file(index, kMaxIndexBytes), origin);
  const fs::path dir = parent_or_dot(index);
  SafetensorsSet s;
  s.path_ = index;
  std::map<std::string, std::size_t> file_number;
  for (const auto& [tensor, file] : weight_map) {
    if (file_number.count(file)) continue;
    try {
      s.files_.push_back(SafetensorsFile::open(dir / file, max_header));
    } catch (const CheckpointError& e) {
      throw CheckpointError("weights index " + origin + " lists " + file + ": " + e.what());
    }
    file_number.emplace(file, s.files_.size() - 1);
  }
  std::vector<std::string> problems;
  for (const auto& [tensor, file] : weight_map) {
    if (!s.files_[file_number.at(file)].contains(tensor)) {
      problems.push_back("it maps " + tensor + " to " + file + ", which does not hold it");
    }
  }
  for (const auto& [file, k] : file_number) {
    for (const TensorInfo& t : s.files_[k].tensors()) {
      const auto listed = weight_map.find(t.name);
      if (listed == weight_map.end()) {
        problems.push_back(file + " holds " + t.name + ", which the index does not list");
      } else if (listed->second != file) {
        problems.push_back(t.name + " is in " + file + " but the index maps it to " +
                           listed->second + " (a tensor in two files?)");
      } else {
        s.tensors_.push_back(t);
        s.file_index_.emplace(t.name, k);
      }
    }
  }
  // A shard of an earlier save with another shard count would otherwise be ignored silently.
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_shard_file_name(name) && !file_number.count(name)) {
      problems.push_back(name +
                         " is beside the index but not listed in it (left from another "
                         "save? move it away)");
    }
  }
  if (!problems.empty()) {
    throw CheckpointError("weights index " + origin +
                          " does not match its shards: " + join_some(problems));
  }
  std::sort(s.tensors_.begin(), s.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  return s;
}

const SafetensorsFile& SafetensorsSet::file_of(std::string_view name) const {
  const auto it = file_index_.find(name);
  // The first file's message names the tensor and what the weights hold.
  return it == file_index_.end() ? files_.front() : files_[it->second];
}

const TensorInfo& SafetensorsSet::info(std::string_view name) const {
  return file_of(name).info(name);
}

void SafetensorsSet::read_f32(std::string_view name, std::span<float> out,
                              std::uint64_t first) const {
  file_of(name).read_f32(name, out, first);
}

void SafetensorsSet::read_f32(std::string_view name, std::span<float> out) const {
  file_of(name).read_f32(name, out);
}

}  // namespace zo::ckpt
