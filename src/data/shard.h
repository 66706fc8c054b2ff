// llm.c / nanoGPT token shard format: a header of 256 little-endian int32 ([0] magic, [1] version,
// [2] token count, rest zero) followed by `count` little-endian tokens: magic 20240520 with
// version 1 holds uint16 tokens (GPT-2), magic 20240801 with version 7 uint32 tokens (llm.c's
// Llama 3 shards, for vocabularies above 65,536).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace zo::data {

inline constexpr int32_t kShardMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;  // uint32 tokens
inline constexpr int32_t kShardVersionU32 = 7;
inline constexpr uint64_t kShardHeaderBytes = 256 * sizeof(int32_t);

struct ShardInfo {
  std::string path;
  uint64_t num_tokens = 0;
  int token_bytes = 2;  // 2 (uint16) or 4 (uint32)
};

// Checks magic, the version that goes with it, a non-empty count and that the file size is
// exactly 1024 + token_bytes * count bytes. Does not read the tokens. DataError naming the file
// otherwise.
ShardInfo validate_shard(const std::string& path);

// True if the file is at least a header long and starts with either shard magic.
bool has_shard_magic(const std::string& path);

// Writes a shard atomically (a temporary file renamed into place): uint16 tokens as version 1,
// uint32 tokens as version 7. DataError on failure, on an empty span or on more than INT32_MAX
// tokens (the count field is an int32).
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens);

}  // namespace zo::data
