// Token sources: random access to a long token sequence made of documents: llm.c / nanoGPT
// token shards, plain text files (byte tokens), or the synthetic Markov-chain stream.
// loader.h cuts a source into training windows; shard.h has the shard format and writer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/synthetic.h"

namespace zo::data {

enum class DataFormat {
  kAuto,       // *.bin files and files that start with the shard magic are shards; others text
  kShards,     // every file must be a token shard
  kText,       // every file is text: byte-level tokens 0..255
  kSynthetic,  // the built-in Markov-chain task; no files
};
DataFormat parse_data_format(const std::string& name);  // auto|shards|text|synthetic, or DataError
const char* to_string(DataFormat format);

struct SourceConfig {
  std::string path;  // a file, a directory (its *.bin files), a glob(3) pattern, or "synthetic"
  DataFormat format = DataFormat::kAuto;
  int64_t vocab_size = 0;     // the model's vocabulary (required): every token must be below it
  bool scan_tokens = true;    // read each shard once at open to reject tokens >= vocab_size
                              // early; the loader still checks every window it reads
  SyntheticConfig synthetic;  // used for format kSynthetic or path "synthetic"
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  virtual size_t num_documents() const = 0;  // shards / files; 1 for the synthetic stream
  virtual uint64_t document_tokens(size_t doc) const = 0;
  virtual const std::string& document_name(size_t doc) const = 0;  // path for files
  // Copies tokens [offset, offset + out.size()) of document `doc`. Thread-safe.
  // DataError if the range is outside the document or the file cannot be read.
  virtual void read(size_t doc, uint64_t offset, std::span<int32_t> out) const = 0;
  virtual int64_t vocab_size() const = 0;  // the bound tokens were checked against
  // Identifies the data for resume checks: kind plus, per document, file name (not directory),
  // token count and a hash of its first and last 64 KiB; or the synthetic config.
  virtual nlohmann::json fingerprint() const = 0;
  virtual std::string describe() const = 0;  // one line for the start-up banner

  uint64_t total_tokens() const;
};

// Opens and validates everything up front (header, size, token range): bad data is rejected
// before any training work.
std::unique_ptr<TokenSource> open_token_source(const SourceConfig& config);

// The synthetic stream as a source (what open_token_source returns for "synthetic"). A
// config.vocab_size of 0 takes the model's; larger than the model's is a DataError.
std::unique_ptr<TokenSource> make_synthetic_source(const SyntheticConfig& config,
                                                   int64_t vocab_size);

// The files a --data path names, in the order the loader numbers them: a file as is; a
// directory's *.bin files (every non-hidden regular file for kText), sorted by name; a glob's
// regular-file matches sorted by name. Hidden files (".name") are skipped in directories.
std::vector<std::string> expand_data_path(const std::string& path, DataFormat format);

}  // namespace zo::data
