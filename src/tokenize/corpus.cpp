#include "tokenize/corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "checkpoint/json_input.h"
#include "core/error.h"
#include "tokenize/utf8.h"

namespace zo::tokenize {
namespace {

namespace fs = std::filesystem;

std::optional<InputFile> classify(const fs::path& p) {
  const std::string ext = p.extension().string();
  if (ext != ".txt" && ext != ".jsonl") return std::nullopt;
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (ec) throw DataError("cannot read input '" + p.string() + "': " + ec.message());
  return InputFile{p.string(), ext == ".jsonl", size};
}

// One file reached twice (given twice, through a link, or as a directory and a file in it)
// would be tokenized twice: refused, naming both.
void refuse_repeats(const std::vector<InputFile>& files) {
  std::map<std::pair<dev_t, ino_t>, const std::string*> seen;
  for (const InputFile& f : files) {
    struct stat st {};
    if (::stat(f.path.c_str(), &st) != 0)
      throw DataError("cannot read input '" + f.path + "': " + std::strerror(errno));
    const auto [it, fresh] = seen.emplace(std::pair(st.st_dev, st.st_ino), &f.path);
    if (!fresh) {
      throw DataError("inputs '" + *it->second + "' and '" + f.path +
                      "' are the same file (given twice, or a directory and a file in it); it "
                      "would be tokenized twice: give it once");
    }
  }
}

std::string where(const Chunk& c, std::uint64_t line) {
  return "'" + c.file->path + "' line " + std::to_string(line);
}

}  // namespace

std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs) {
  std::vector<InputFile> out;
  for (const std::string& in : inputs) {
    const fs::path p(in);
    std::error_code ec;
    const auto st = fs::status(p, ec);
    if (ec || !fs::exists(st))
      throw DataError("input '" + in + "' does not exist" + (ec ? ": " + ec.message() : ""));
    if (fs::is_directory(st)) {
      std::vector<fs::path> names;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        const std::string name = e.path().filename().string();
        if (!name.empty() && name[0] != '.' && e.is_regular_file()) names.push_back(e.path());
      }
      if (ec) throw DataError("cannot list input directory '" + in + "': " + ec.message());
      std::sort(names.begin(), names.end());
      const std::size_t before = out.size();
      for (const auto& n : names)
        if (auto f = classify(n)) out.push_back(*f);
      if (out.size() == before)
        throw DataError("input directory '" + in + "' holds no .txt or .jsonl files");
      continue;
    }
    if (!fs::is_regular_file(st)) {
      throw DataError("input '" + in + "' is not a regular file (" +
                      (fs::is_fifo(st) ? "a FIFO" : "a device or socket") +
                      "); tokenize reads files whose size it can know: save the text to a file");
    }
    auto f = classify(p);
    if (!f)
      throw DataError("input '" + in +
                      "' is neither .txt (one document) nor .jsonl (one JSON object a line); "
                      "rename it or convert it");
    out.push_back(*f);
  }
  refuse_repeats(out);
  return out;
}

ChunkReader::ChunkReader(const std::vector<InputFile>& files, std::size_t chunk_bytes)
    : files_(files), chunk_bytes_(chunk_bytes) {}

ChunkReader::~ChunkReader() {
  if (f_) std::fclose(f_);
}

std::optional<Chunk> ChunkReader::next() {
  while (index_ < files_.size()) {
    const InputFile& file = files_[index_];
    if (!f_) {
      f_ = std::fopen(file.path.c_str(), "rb");
      if (!f_) throw DataError("cannot open input '" + file.path + "': " + std::strerror(errno));
      line_ = 1;
      carry_.clear();
    }
    Chunk c{&file, line_, std::move(carry_)};
    carry_.clear();
    std::size_t want = file.jsonl ? std::max(chunk_bytes_, c.bytes.size() + 1) : SIZE_MAX;
    bool at_end = false;
    while (true) {
      char buf[1 << 16];
      while (c.bytes.size() < want) {
        const std::size_t n = std::fread(buf, 1, sizeof buf, f_);
        if (n == 0) break;
        c.bytes.append(buf, n);
      }
      if (std::ferror(f_))
        throw DataError("cannot read input '" + file.path + "': " + std::strerror(errno));
      at_end = std::feof(f_) != 0;
      if (at_end) break;
      // Keep the unfinished last line for the next chunk; a line longer than a chunk reads on.
      const auto nl = c.bytes.rfind('\n');
      if (nl != std::string::npos) {
        carry_.assign(c.bytes, nl + 1, std::string::npos);
        c.bytes.resize(nl + 1);
        break;
      }
      want = 2 * c.bytes.size();
    }
    if (file.jsonl)
      line_ += static_cast<std::uint64_t>(std::count(c.bytes.begin(), c.bytes.end(), '\n'));
    if (at_end) {
      std::fclose(f_);
      f_ = nullptr;
      ++index_;
    }
    if (!c.bytes.empty() || !file.jsonl) return c;
  }
  return std::nullopt;
}

void for_each_document(const Chunk& chunk, const std::string& field,
                       const std::function<void(std::string_view)>& emit) {
  const std::string_view all = chunk.bytes;
  if (!chunk.file->jsonl) {
    if (const auto bad = first_invalid_utf8(all); bad != kValidUtf8) {
      const auto line = 1 + std::count(all.begin(), all.begin() + static_cast<long>(bad), '\n');
      throw DataError("'" + chunk.file->path + "' is not valid UTF-8 at byte offset " +
                      std::to_string(bad) + " (line " + std::to_string(line) +
                      "); convert it to UTF-8 (iconv) or leave it out");
    }
    return emit(all);
  }
  std::uint64_t line = chunk.first_line;
  for (std::size_t at = 0; at < all.size(); ++line) {
    auto end = all.find('\n', at);
    if (end == std::string_view::npos) end = all.size();
    std::string_view text = all.substr(at, end - at);
    at = end + 1;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.find_first_not_of(" \t") == std::string_view::npos) continue;
    nlohmann::json j;
    try {
      j = ckpt::parse_json(text);  // refuses invalid UTF-8 and lone surrogates in strings
    } catch (const std::exception& e) {
      // Raw bytes: said by offset, not echoed to the terminal in the parser's message.
      if (const auto bad = first_invalid_utf8(text); bad != kValidUtf8) {
        throw DataError(where(chunk, line) + " is not valid UTF-8 at byte " + std::to_string(bad) +
                        " of the line; convert the file to UTF-8 (iconv) or leave it out");
      }
      throw DataError(where(chunk, line) + " is not a JSON object: " + e.what());
    }
    if (!j.is_object()) throw DataError(where(chunk, line) + " is not a JSON object");
    const auto it = j.find(field);
    if (it == j.end() || !it->is_string()) {
      throw DataError(where(chunk, line) + " has no string field \"" + field +
                      "\"; name the document's field with --text-field");
    }
    emit(it->get_ref<const std::string&>());
  }
}

}  // namespace zo::tokenize
