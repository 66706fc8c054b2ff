// llm.c / nanoGPT token shard format: a header of 256 little-endian int32 ([0] magic 20240520,
// [1] version 1, [2] token count, rest zero) followed by `count` little-endian uint16 tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace zo::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr uint64_t kShardHeaderBytes = 256 * sizeof(int32_t);

struct ShardInfo {
  std::string path;
  uint64_t num_tokens = 0;
};

// Checks magic, version, a non-empty count and that the file size is exactly
// 1024 + 2 * count bytes. Does not read the tokens. DataError naming the file otherwise.
ShardInfo validate_shard(const std::string& path);

// True if the file is at least a header long and starts with the shard magic.
bool has_shard_magic(const std::string& path);

// Writes a shard atomically (a temporary file renamed into place). DataError on failure, on an
// empty span or on more than INT32_MAX tokens (the count field is an int32).
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace zo::data
