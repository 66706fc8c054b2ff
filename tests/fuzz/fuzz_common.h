// Shared by the libFuzzer targets (fuzz_*.cpp) and the seed-corpus generator (make_corpus.cpp):
// a private scratch directory, the rule for what counts as a bug, and the fixtures the targets
// read next to the fuzzed input (built the same way by both, so the seeds match them exactly).
#pragma once

#include <stdlib.h>  // mkdtemp

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "model/spec.h"

namespace zo::fuzz {

// A directory of this process's own under $TMPDIR (or /tmp), removed at a normal exit.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      std::string pattern = (std::filesystem::temp_directory_path() / "zo-fuzz-XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) std::terminate();
      path = pattern;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline void write_file(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) std::terminate();  // the harness itself failed, not the code under test
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  write_file(path, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

// A clear error (any std::exception, which the CLI prints as "offload_train: error: ...") is a
// correct answer to a bad input. What escapes this (another exception type, which terminates),
// a sanitizer report, a hang or a huge allocation is a bug that libFuzzer reports.
// ZO_FUZZ_SHOW_ERRORS=1 prints each message (to see what an input gets: run the target on it).
template <class F>
void expect_clear_error(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    static const bool show = std::getenv("ZO_FUZZ_SHOW_ERRORS") != nullptr;
    if (show) std::fprintf(stderr, "clear error: %s\n", e.what());
  }
}

// A property every accepted input must have; a violation is a bug like a sanitizer report.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz target: invariant violated: %s\n", what);
    std::abort();
  }
}

// The smallest GPT-2 the trainer accepts, for checkpoints and weight files of a few KiB.
inline model::ModelSpec micro_spec() {
  model::ModelSpec s;
  s.name = "micro";
  s.n_layer = 1;
  s.n_head = 1;
  s.n_embd = 4;
  s.vocab_size = 8;
  s.block_size = 4;
  return s;
}

// Tokens of fixture shard k (0 or 1): 200 + 40 k tokens below 256.
inline std::vector<std::uint16_t> fixture_tokens(int k) {
  std::vector<std::uint16_t> t(static_cast<std::size_t>(200 + 40 * k));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::uint16_t>((i * 37 + static_cast<std::size_t>(k) * 11) % 256);
  return t;
}

}  // namespace zo::fuzz
