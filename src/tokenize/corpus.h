// The documents of `offload_train tokenize`'s inputs: a .txt file is one document, a .jsonl file
// one document per line (a JSON object's string field), a directory its .txt/.jsonl files in
// sorted order. Files are read in chunks that end at a line boundary, so that workers can parse
// and encode chunks in parallel while the documents keep their input order.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zo::tokenize {

struct InputFile {
  std::string path;
  bool jsonl = false;
  std::uint64_t size = 0;
};

// Expands directories (sorted, hidden files skipped) and checks every name. DataError for a
// missing or unreadable path, an empty directory, a file that is neither .txt nor .jsonl, or a
// file reached twice.
std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs);

struct Chunk {
  const InputFile* file = nullptr;
  std::uint64_t first_line = 1;  // of a .jsonl chunk, 1-based
  std::string bytes;
};

// Reads the files in order: a .txt file as one chunk, a .jsonl file in chunks of about
// `chunk_bytes` ending at a newline.
class ChunkReader {
 public:
  ChunkReader(const std::vector<InputFile>& files, std::size_t chunk_bytes);
  ~ChunkReader();
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;
  std::optional<Chunk> next();  // nothing at the end; DataError on a read error

 private:
  const std::vector<InputFile>& files_;
  std::size_t chunk_bytes_;
  std::size_t index_ = 0;
  std::FILE* f_ = nullptr;
  std::string carry_;  // an unfinished line from the last read
  std::uint64_t line_ = 1;
};

// Calls `emit` with the text of each document of the chunk, in order. DataError naming the file
// and line (or byte offset) for invalid UTF-8, a line that is not a JSON object or lacks
// `field` as a string. Empty lines of a .jsonl file are skipped.
void for_each_document(const Chunk& chunk, const std::string& field,
                       const std::function<void(std::string_view)>& emit);

}  // namespace zo::tokenize
