// Where `offload_train tokenize` writes: shards named NAME_train_000000.bin, NAME_val_000000.bin,
// ... in the output directory. They are written into a hidden staging directory inside it and
// moved into place only when every input was tokenized, so a failed run leaves no shard behind
// and an earlier run's shards of the same NAME are replaced only with --force.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/atomic_io.h"

namespace zo::tokenize {

class ShardOutput {
 public:
  static constexpr std::size_t kMaxNameBytes = 224;  // 255 - 31: see the constructor

  // Creates the output directory if needed. DataError when it already holds NAME's shards and
  // `force` is false, or NAME is not a plain name of at most kMaxNameBytes.
  ShardOutput(const std::filesystem::path& dir, const std::string& name, bool force);
  ShardOutput(const ShardOutput&) = delete;
  ShardOutput& operator=(const ShardOutput&) = delete;

  // Writes the next shard of `split` ("train" or "val") into the staging directory; tokens as
  // uint16 (llm.c version 1) when `wide` is false, else uint32 (version 7).
  void write(const std::string& split, const std::vector<std::uint32_t>& tokens, bool wide);
  int shards(const std::string& split) const;

  // Moves the shards into place and removes NAME's older shards that were not replaced.
  void commit();

  // NAME's shards in `dir` (NAME_train_NNNNNN.bin, NAME_val_NNNNNN.bin).
  static std::vector<std::filesystem::path> existing(const std::filesystem::path& dir,
                                                     const std::string& name);

 private:
  std::filesystem::path dir_;
  std::string name_;
  // The hidden directory the shards are written into, removed when this goes (never committed:
  // commit() moves the shards out of it).
  std::optional<ckpt::AtomicDirectory> staging_;
  std::vector<std::filesystem::path> written_;  // in staging_
  int train_ = 0, val_ = 0;
};

}  // namespace zo::tokenize
