#include "data/shard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <vector>

#include "data/file_io.h"
#include "data/token_source.h"

namespace zo::data {
namespace {

int32_t load_le_i32(const unsigned char* p) {
  const uint32_t u =
      uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  return static_cast<int32_t>(u);
}

void store_le_i32(unsigned char* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<unsigned char>(u >> (8 * i));
}

constexpr const char* kRegenerateHint =
    "regenerate the shard (or re-download it), or remove it from the data set";

}  // namespace

ShardInfo validate_shard(const std::string& path) {
  const detail::File file = detail::File::open(path);
  const uint64_t size = file.size();
  if (size == 0) {
    throw DataError("token shard '" + path + "' is empty (0 bytes); expected a " +
                    std::to_string(kShardHeaderBytes) +
                    "-byte header and tokens: " + kRegenerateHint);
  }
  if (size < kShardHeaderBytes) {
    throw DataError("token shard '" + path + "' is truncated: " + std::to_string(size) +
                    " bytes, shorter than the " + std::to_string(kShardHeaderBytes) +
                    "-byte header of an llm.c token shard: " + kRegenerateHint);
  }
  std::array<unsigned char, 12> head{};
  file.read_at(0, head.data(), head.size());
  const int32_t magic = load_le_i32(head.data());
  const int32_t version = load_le_i32(head.data() + 4);
  const int32_t count = load_le_i32(head.data() + 8);
  if (magic != kShardMagic && magic != kShardMagicU32) {
    throw DataError("'" + path + "' is not an llm.c token shard: header magic is " +
                    std::to_string(magic) + ", expected " + std::to_string(kShardMagic) +
                    " (uint16 tokens) or " + std::to_string(kShardMagicU32) +
                    " (uint32 tokens). If it is a text file, give it a name not ending in .bin "
                    "or pass --data-format text; otherwise " +
                    kRegenerateHint);
  }
  const bool u32 = magic == kShardMagicU32;
  const int32_t want_version = u32 ? kShardVersionU32 : kShardVersion;
  if (version != want_version) {
    throw DataError("token shard '" + path + "' has format version " + std::to_string(version) +
                    ", expected " + std::to_string(want_version) + " with magic " +
                    std::to_string(magic) + (u32 ? " (uint32 tokens)" : " (uint16 tokens)") +
                    "; re-export it with llm.c's writer (fineweb.py style) or "
                    "write_token_shard");
  }
  const int token_bytes = u32 ? 4 : 2;
  if (count <= 0) {
    throw DataError("token shard '" + path + "' is empty: its header says " +
                    std::to_string(count) + " tokens, expected at least 1: " + kRegenerateHint);
  }
  const uint64_t expected = kShardHeaderBytes + token_bytes * static_cast<uint64_t>(count);
  if (size < expected) {
    throw DataError("token shard '" + path + "' is truncated: its header promises " +
                    std::to_string(count) + " tokens, so the file should be " +
                    std::to_string(expected) + " bytes, but it is " + std::to_string(size) +
                    " bytes (" + std::to_string((size - kShardHeaderBytes) / token_bytes) +
                    " tokens); an interrupted download or copy? " + kRegenerateHint);
  }
  if (size > expected) {
    throw DataError("token shard '" + path + "' is " + std::to_string(size) +
                    " bytes but its header promises " + std::to_string(count) + " tokens, i.e. " +
                    std::to_string(expected) + " bytes: " + std::to_string(size - expected) +
                    " extra bytes after the tokens (token count in the header is wrong, or two "
                    "files were concatenated): " +
                    kRegenerateHint);
  }
  return ShardInfo{path, static_cast<uint64_t>(count), token_bytes};
}

bool has_shard_magic(const std::string& path) {
  const detail::File file = detail::File::open(path);
  if (file.size() < kShardHeaderBytes) return false;
  std::array<unsigned char, 4> head{};
  file.read_at(0, head.data(), head.size());
  const int32_t magic = load_le_i32(head.data());
  return magic == kShardMagic || magic == kShardMagicU32;
}

namespace {

// The header and the tokens, little-endian, into `path` through a temporary file.
template <class Token>
void write_shard(const std::string& path, std::span<const Token> tokens, int32_t magic,
                 int32_t version) {
  if (tokens.empty()) {
    throw DataError("write_token_shard('" + path + "'): no tokens; a shard must hold at least one");
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw DataError("write_token_shard('" + path + "'): " + std::to_string(tokens.size()) +
                    " tokens do not fit the int32 count field; split them into several shards");
  }
  std::vector<unsigned char> header(kShardHeaderBytes, 0);
  store_le_i32(header.data(), magic);
  store_le_i32(header.data() + 4, version);
  store_le_i32(header.data() + 8, static_cast<int32_t>(tokens.size()));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw DataError("cannot create '" + tmp + "': " + detail::errno_message(errno) +
                    "; check that the directory exists and is writable");
  }
  auto write_all = [&](const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const std::string why = detail::errno_message(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw DataError("cannot write token shard '" + tmp + "': " + why +
                        " (disk full or quota?)");
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(header.data(), header.size());
  if constexpr (std::endian::native == std::endian::little) {
    write_all(tokens.data(), tokens.size_bytes());
  } else {
    std::vector<unsigned char> le(tokens.size_bytes());
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (size_t b = 0; b < sizeof(Token); ++b)
        le[sizeof(Token) * i + b] = static_cast<unsigned char>(tokens[i] >> (8 * b));
    }
    write_all(le.data(), le.size());
  }
  if (::close(fd) != 0) {
    const std::string why = detail::errno_message(errno);
    ::unlink(tmp.c_str());
    throw DataError("cannot write token shard '" + tmp + "': " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = detail::errno_message(errno);
    ::unlink(tmp.c_str());
    throw DataError("cannot rename '" + tmp + "' to '" + path + "': " + why);
  }
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  write_shard(path, tokens, kShardMagic, kShardVersion);
}

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens) {
  write_shard(path, tokens, kShardMagicU32, kShardVersionU32);
}

}  // namespace zo::data
