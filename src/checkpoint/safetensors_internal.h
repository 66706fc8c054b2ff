// Internals shared by the safetensors files (safetensors_header.cpp, safetensors_reader.cpp,
// safetensors_writer.cpp), not part of the safetensors.h API.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>

#include "checkpoint/safetensors.h"

namespace zo::ckpt {

// Tensor bytes are copied to and from memory as they are: the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

inline constexpr std::size_t kChunkElems = std::size_t{1} << 16;  // conversion buffer (elements)

// Throw CheckpointError "safetensors file '<p>': [tensor '<name>': ]<what>".
[[noreturn]] void fail(const std::filesystem::path& p, const std::string& what);
[[noreturn]] void fail_tensor(const std::filesystem::path& p, const std::string& name,
                              const std::string& what);

// a * b, or nullopt on 64-bit overflow.
inline std::optional<std::uint64_t> mul_checked(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

}  // namespace zo::ckpt
