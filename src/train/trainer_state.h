// trainer_state.json as the checkpoint readers may trust it: every key a loader uses is checked
// for type, range and consistency before any of it is used, and a bad one is refused by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace zo::train {

// Token and batch counts above 2^53 (exact in a double) are refused: no run gets there, and
// everything that computes with them stays exact and free of overflow. Steps are bounded as
// --steps is (kMaxSteps).
inline constexpr std::uint64_t kMaxCount = std::uint64_t{1} << 53;

// Throws CheckpointError naming the checkpoint, the key, its value and what is expected: the
// format version, step, tokens, adam_step (<= step), run id and save time, the model spec, the
// data loader's state, the loss scaler, the recorded config and rng, and the optimizer shards
// (against the spec's layout).
void validate_trainer_state(const nlohmann::json& state, const std::filesystem::path& dir);

// One optimizer shard file of a data-parallel checkpoint and the layout ranges it holds, in the
// order of its local arrays.
struct ShardFile {
  std::string name;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;  // [begin, end)
  std::size_t local_size = 0;                               // the sum of the ranges' sizes
};

// "optimizer_shards" checked against a layout of layout_size parameters: one file per rank with
// its canonical name, non-empty ranges ascending in each file, all of them together tiling
// [0, layout_size) exactly. Throws CheckpointError.
std::vector<ShardFile> shard_files(const nlohmann::json& shards, std::size_t layout_size,
                                   const std::filesystem::path& dir);

// Refuses a file holding tensors other than `expected` (nothing would read them: the file is not
// the one this checkpoint format writes).
void expect_only(const ckpt::SafetensorsFile& file, const std::set<std::string>& expected);

}  // namespace zo::train
