// Editing a checkpoint as a damaged writer would have: a file's content is what the test says,
// and the manifest's checksums match it, so only the readers' own checks can catch it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/atomic_io.h"
#include "checkpoint/safetensors.h"

namespace zo::test {

inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Replaces (or with nullopt removes) one file of checkpoint `dir` and writes a matching manifest.
inline void reseal(const std::filesystem::path& dir, const std::string& name,
                   const std::optional<std::string>& bytes) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string rel = e.path().lexically_relative(dir).generic_string();
    if (e.is_regular_file() && rel != "MANIFEST.json" && rel != name)
      files.emplace_back(rel, file_bytes(e.path()));
  }
  if (bytes) files.emplace_back(name, *bytes);
  ckpt::AtomicDirectory d(dir, ckpt::IfExists::kReplace);
  for (const auto& [rel, content] : files)
    d.write_file(rel, content);
  d.commit();
}

// The checkpoint's (fp32) model.safetensors with elements [first, first + count) of tensor `name`
// (all of them by default) set to v.
inline void set_weights(const std::filesystem::path& dir, const std::string& name, float v,
                        std::uint64_t first = 0,
                        std::uint64_t count = std::numeric_limits<std::uint64_t>::max()) {
  const std::filesystem::path file = dir / "model.safetensors";
  std::uint64_t at = 0, n = 0;
  {
    const auto f = ckpt::SafetensorsFile::open(file);
    ASSERT_EQ(f.info(name).dtype_name, "F32");
    ASSERT_LE(first, f.info(name).numel);
    at = 8 + f.header_size() + f.info(name).data_begin;
    n = std::min(count, f.info(name).numel - first);
  }
  std::string bytes = file_bytes(file);
  for (std::uint64_t i = first; i < first + n; ++i)
    std::memcpy(bytes.data() + at + 4 * i, &v, 4);
  reseal(dir, "model.safetensors", bytes);
}

}  // namespace zo::test
