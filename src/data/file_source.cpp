// Token sources backed by files: llm.c token shards and plain text (bytes), plus path expansion
// and the open_token_source factory.
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>

#include "data/file_io.h"
#include "data/shard.h"
#include "data/token_source.h"

namespace zo::data {

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kHashBytes = 64 * 1024;   // hashed at each end of a file
constexpr size_t kScanChunkBytes = 1 << 20;  // vocabulary scan read size
constexpr size_t kMaxOpenFiles = 64;         // read-side descriptor cache

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool has_glob_chars(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string human_count(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ULL) {
    std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  } else if (n >= 1000000ULL) {
    std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
  } else if (n >= 10000ULL) {
    std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%" PRIu64, n);
  }
  return buf;
}

uint64_t fnv1a(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

struct FileDoc {
  std::string path;
  uint64_t data_offset = 0;  // bytes before the first token
  uint64_t tokens = 0;
  int token_bytes = 1;  // 1 (text), 2 or 4 (shards)
  std::string hash;
};

// Little-endian token i of `raw`, `bytes` bytes each.
uint32_t token_at(const unsigned char* raw, uint64_t i, int bytes) {
  const unsigned char* p = raw + i * static_cast<uint64_t>(bytes);
  uint32_t t = 0;
  for (int b = bytes - 1; b >= 0; --b)
    t = t << 8 | p[b];
  return t;
}

// Shards (2- or 4-byte tokens after a 1 KiB header) or text (1-byte tokens), one document per
// file.
class FileTokenSource final : public TokenSource {
 public:
  FileTokenSource(std::vector<FileDoc> docs, bool shards, int64_t vocab_size, std::string origin,
                  bool scanned)
      : docs_(std::move(docs)),
        shards_(shards),
        vocab_size_(vocab_size),
        origin_(std::move(origin)),
        scanned_(scanned) {}

  size_t num_documents() const override { return docs_.size(); }
  uint64_t document_tokens(size_t doc) const override { return docs_.at(doc).tokens; }
  const std::string& document_name(size_t doc) const override { return docs_.at(doc).path; }
  int64_t vocab_size() const override { return vocab_size_; }

  void read(size_t doc, uint64_t offset, std::span<int32_t> out) const override {
    const FileDoc& d = docs_.at(doc);
    if (offset > d.tokens || out.size() > d.tokens - offset) {
      throw DataError("read of tokens [" + std::to_string(offset) + ", " +
                      std::to_string(offset + out.size()) + ") is outside '" + d.path +
                      "', which has " + std::to_string(d.tokens) + " tokens");
    }
    const size_t n = out.size();
    const size_t bytes = n * static_cast<size_t>(d.token_bytes);
    std::vector<unsigned char> raw(bytes);
    // The cache lock covers only the lookup; pread runs unlocked (an evicted File stays open
    // until its last reader lets go of it).
    const std::shared_ptr<const detail::File> file = file_for(doc);
    file->read_at(d.data_offset + offset * d.token_bytes, raw.data(), bytes);
    // A uint32 token above INT32_MAX wraps negative, which the loader's range check refuses.
    for (size_t i = 0; i < n; ++i)
      out[i] = static_cast<int32_t>(token_at(raw.data(), i, d.token_bytes));
  }

  nlohmann::json fingerprint() const override {
    nlohmann::json files = nlohmann::json::array();
    for (const FileDoc& d : docs_) {
      files.push_back(
          {{"name", fs::path(d.path).filename().string()}, {"tokens", d.tokens}, {"hash", d.hash}});
    }
    return {{"kind", shards_ ? "shards" : "text"}, {"files", files}};
  }

  std::string describe() const override {
    const bool shards = shards_;
    std::string s = std::to_string(docs_.size()) + (shards ? " token shard" : " text file") +
                    (docs_.size() == 1 ? "" : "s") + " from '" + origin_ + "', " +
                    human_count(total_tokens()) + (shards ? " tokens" : " bytes (byte tokens)");
    if (shards) {
      s += scanned_ ? ", all tokens checked < vocab_size " + std::to_string(vocab_size_)
                    : ", token range checked as windows are read";
    }
    return s;
  }

 private:
  std::shared_ptr<const detail::File> file_for(size_t doc) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = open_.find(doc); it != open_.end()) return it->second;
    if (open_order_.size() >= kMaxOpenFiles) {
      open_.erase(open_order_.front());
      open_order_.pop_front();
    }
    auto file = std::make_shared<const detail::File>(detail::File::open(docs_[doc].path));
    open_.emplace(doc, file);
    open_order_.push_back(doc);
    return file;
  }

  std::vector<FileDoc> docs_;
  bool shards_;
  int64_t vocab_size_;
  std::string origin_;
  bool scanned_;
  mutable std::mutex mu_;
  mutable std::map<size_t, std::shared_ptr<const detail::File>> open_;  // at most kMaxOpenFiles
  mutable std::deque<size_t> open_order_;  // oldest opened is closed first
};

std::string content_hash(const detail::File& file, uint64_t data_offset, uint64_t data_bytes) {
  const uint64_t head = std::min(data_bytes, kHashBytes);
  const uint64_t tail_start = std::max(head, data_bytes - std::min(data_bytes, kHashBytes));
  std::vector<unsigned char> buf(kHashBytes);
  uint64_t h = 0xcbf29ce484222325ULL;
  file.read_at(data_offset, buf.data(), head);
  h = fnv1a(h, buf.data(), head);
  file.read_at(data_offset + tail_start, buf.data(), data_bytes - tail_start);
  h = fnv1a(h, buf.data(), data_bytes - tail_start);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  return hex;
}

// Every token of a shard of `token_bytes`-byte tokens fits a vocabulary of vocab_size.
bool always_in_vocab(int token_bytes, int64_t vocab_size) {
  return token_bytes == 2 && vocab_size > 65535;
}

// One sequential pass over the tokens; names the first one >= vocab_size.
void scan_shard_tokens(const detail::File& file, const ShardInfo& info, int64_t vocab_size) {
  if (always_in_vocab(info.token_bytes, vocab_size)) return;
  const uint64_t tokens = info.num_tokens, w = static_cast<uint64_t>(info.token_bytes);
  std::vector<unsigned char> buf(kScanChunkBytes);
  for (uint64_t first = 0; first < tokens;) {
    const uint64_t n = std::min<uint64_t>(tokens - first, kScanChunkBytes / w);
    file.read_at(kShardHeaderBytes + w * first, buf.data(), w * n);
    for (uint64_t i = 0; i < n; ++i) {
      const int64_t t = token_at(buf.data(), i, info.token_bytes);
      if (t >= vocab_size) {
        throw DataError("token shard '" + file.path() + "' has token " + std::to_string(t) +
                        " at position " + std::to_string(first + i) + " (byte " +
                        std::to_string(kShardHeaderBytes + w * (first + i)) +
                        "), but the model's vocab_size is " + std::to_string(vocab_size) +
                        ": the shard was made with a different tokenizer, or the model needs a "
                        "larger vocab_size (GPT-2 BPE needs 50257)");
      }
    }
    first += n;
  }
}

FileDoc open_shard_doc(const std::string& path, int64_t vocab_size, bool scan) {
  const ShardInfo info = validate_shard(path);
  const detail::File file = detail::File::open(path);
  if (scan) scan_shard_tokens(file, info, vocab_size);
  return FileDoc{path, kShardHeaderBytes, info.num_tokens, info.token_bytes,
                 content_hash(file, kShardHeaderBytes, info.token_bytes * info.num_tokens)};
}

FileDoc open_text_doc(const std::string& path) {
  const detail::File file = detail::File::open(path);
  const uint64_t size = file.size();
  if (size == 0) {
    throw DataError("text file '" + path +
                    "' is empty; remove it from the data set or give a file with text in it");
  }
  return FileDoc{path, 0, size, 1, content_hash(file, 0, size)};
}

}  // namespace

DataFormat parse_data_format(const std::string& name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "shards" || name == "shard" || name == "bin") return DataFormat::kShards;
  if (name == "text" || name == "txt") return DataFormat::kText;
  if (name == "synthetic") return DataFormat::kSynthetic;
  throw DataError("unknown data format '" + name +
                  "'; expected one of: auto, shards, text, synthetic");
}

const char* to_string(DataFormat format) {
  switch (format) {
    case DataFormat::kAuto:
      return "auto";
    case DataFormat::kShards:
      return "shards";
    case DataFormat::kText:
      return "text";
    case DataFormat::kSynthetic:
      return "synthetic";
  }
  return "?";
}

uint64_t TokenSource::total_tokens() const {
  uint64_t n = 0;
  for (size_t d = 0; d < num_documents(); ++d)
    n += document_tokens(d);
  return n;
}

std::vector<std::string> expand_data_path(const std::string& path, DataFormat format) {
  if (path.empty()) {
    throw DataError(
        "no data path given: pass --data with a shard file, a directory of *.bin "
        "shards, a glob such as 'data/*_train_*.bin', a text file, or 'synthetic'");
  }
  std::vector<std::string> files;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return {path};
    const bool text = format == DataFormat::kText;
    size_t skipped = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      if (!is_regular_file(entry.path().string())) continue;
      if (text || ends_with(name, ".bin")) {
        files.push_back(entry.path().string());
      } else {
        ++skipped;
      }
    }
    if (ec) throw DataError("cannot list data directory '" + path + "': " + ec.message());
    if (files.empty()) {
      throw DataError(
          "data directory '" + path + "' has no " + (text ? "files" : "*.bin token shards") +
          (skipped ? " (it has " + std::to_string(skipped) + " other files)" : "") +
          (text ? "" : "; to train on text files in it pass --data-format text, or name a file"));
    }
  } else if (has_glob_chars(path)) {
    glob_t g{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &g);
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (is_regular_file(g.gl_pathv[i])) files.emplace_back(g.gl_pathv[i]);
      }
    }
    ::globfree(&g);
    if (rc != 0 && rc != GLOB_NOMATCH) {
      throw DataError("cannot expand data pattern '" + path + "' (glob error " +
                      std::to_string(rc) + "): check that its directories are readable");
    }
    if (files.empty()) {
      throw DataError("data pattern '" + path +
                      "' matches no files: check the directory and the pattern (quote it so the "
                      "shell does not expand it)");
    }
  } else {
    throw DataError("data path '" + path +
                    "' does not exist: pass a shard file, a directory of *.bin shards, a glob "
                    "such as 'data/*_train_*.bin', a text file, or 'synthetic'");
  }
  // Byte order, not locale collation: the same files get the same numbering everywhere.
  std::sort(files.begin(), files.end());
  return files;
}

std::unique_ptr<TokenSource> open_token_source(const SourceConfig& config) {
  if (config.vocab_size <= 0) {
    throw DataError("SourceConfig.vocab_size must be the model's vocab_size (got " +
                    std::to_string(config.vocab_size) + ")");
  }
  if (config.format == DataFormat::kSynthetic || config.path == "synthetic") {
    if (!config.path.empty() && config.path != "synthetic") {
      throw DataError("data format 'synthetic' needs no files, but a path '" + config.path +
                      "' was given; drop the path or choose another format");
    }
    return make_synthetic_source(config.synthetic, config.vocab_size);
  }

  const std::vector<std::string> files = expand_data_path(config.path, config.format);
  std::vector<std::string> shard_files, text_files;
  for (const std::string& f : files) {
    bool shard = config.format == DataFormat::kShards;
    if (config.format == DataFormat::kAuto) shard = ends_with(f, ".bin") || has_shard_magic(f);
    (shard ? shard_files : text_files).push_back(f);
  }
  if (!shard_files.empty() && !text_files.empty()) {
    throw DataError("data path '" + config.path + "' mixes token shards ('" + shard_files[0] +
                    "') and text files ('" + text_files[0] +
                    "'): their tokens mean different things; pass one kind, or force one with "
                    "--data-format");
  }
  std::vector<FileDoc> docs;
  if (!shard_files.empty()) {
    bool all_in_vocab = true;
    for (const std::string& f : shard_files) {
      docs.push_back(open_shard_doc(f, config.vocab_size, config.scan_tokens));
      all_in_vocab = all_in_vocab && always_in_vocab(docs.back().token_bytes, config.vocab_size);
    }
    return std::make_unique<FileTokenSource>(std::move(docs), true, config.vocab_size,
                                             config.path, config.scan_tokens || all_in_vocab);
  }
  if (config.vocab_size < 256) {
    throw DataError(
        "text files are read as byte tokens 0..255, which needs vocab_size >= 256; "
        "the model has vocab_size " +
        std::to_string(config.vocab_size) +
        ": use a larger vocab_size or tokenize the text into shards");
  }
  for (const std::string& f : text_files)
    docs.push_back(open_text_doc(f));
  return std::make_unique<FileTokenSource>(std::move(docs), false, config.vocab_size,
                                           config.path, true);
}

}  // namespace zo::data
