// `offload_train tokenize`: text files -> llm.c token shards, on all cores. Each document becomes
// the document token followed by its tokens; the first `val_docs` documents go to the val split,
// the rest to train; a shard holds at most `shard_tokens` tokens (a document may continue in the
// next one).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tokenize/tokenizer.h"

namespace zo::tokenize {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string name;  // default: the first input's stem
  std::uint64_t val_docs = 0;
  std::uint64_t shard_tokens = 100'000'000;
  std::string text_field = "text";
  std::string doc_token;  // default: Tokenizer::default_document_token()
  int threads = 0;        // 0 = all cores
  bool force = false;
  std::size_t chunk_bytes = 1 << 20;  // of .jsonl input, or of one long document, per task
};

struct TokenizeSummary {
  std::uint64_t documents = 0, val_documents = 0;
  std::uint64_t train_tokens = 0, val_tokens = 0;
  int train_shards = 0, val_shards = 0;
  std::uint64_t bytes = 0;  // of input read
  double seconds = 0;
  std::string summary_line() const;
};

// `progress`: where a progress line is redrawn (a terminal), or null. DataError (or
// std::invalid_argument for bad options) on any problem, with no shard left behind.
TokenizeSummary tokenize_files(const TokenizeOptions& options, const Tokenizer& tokenizer,
                               std::FILE* progress);

}  // namespace zo::tokenize
