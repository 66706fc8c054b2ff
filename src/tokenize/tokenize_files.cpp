#include "tokenize/tokenize_files.h"

#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "tokenize/corpus.h"
#include "tokenize/parallel_encode.h"
#include "tokenize/shard_output.h"

namespace zo::tokenize {
namespace {

using Clock = std::chrono::steady_clock;

// One chunk's documents, encoded: their tokens back to back, each led by the document token.
struct Encoded {
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint32_t> lengths;  // per document, the document token included
  std::uint64_t bytes = 0;
};

// Fills the current shard of one split and writes it when full.
class SplitWriter {
 public:
  SplitWriter(ShardOutput& out, std::string split, std::uint64_t limit, bool wide)
      : out_(out), split_(std::move(split)), limit_(limit), wide_(wide) {}
  void add(const std::uint32_t* t, std::uint64_t n) {
    tokens_ += n;
    while (n > 0) {
      const std::uint64_t take = std::min<std::uint64_t>(n, limit_ - buf_.size());
      buf_.insert(buf_.end(), t, t + take);
      t += take;
      n -= take;
      if (buf_.size() == limit_) flush();
    }
  }
  void flush() {
    if (buf_.empty()) return;
    out_.write(split_, buf_, wide_);
    buf_.clear();
  }
  std::uint64_t tokens() const { return tokens_; }

 private:
  ShardOutput& out_;
  std::string split_;
  std::uint64_t limit_;
  bool wide_;
  std::vector<std::uint32_t> buf_;
  std::uint64_t tokens_ = 0;
};

std::string with_commas(std::uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string duration(double s) {
  const auto t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  }
  return buf;
}

}  // namespace

std::string TokenizeSummary::summary_line() const {
  char rate[96];
  std::snprintf(rate, sizeof rate, "%.0f tokens/s, %.1f MB/s, %.1f s",
                seconds > 0 ? double(train_tokens + val_tokens) / seconds : 0.0,
                seconds > 0 ? double(bytes) / 1e6 / seconds : 0.0, seconds);
  return "tokenized " + with_commas(documents) + " documents: train " +
         with_commas(documents - val_documents) + " documents, " + with_commas(train_tokens) +
         " tokens in " + std::to_string(train_shards) + " shards; val " +
         with_commas(val_documents) + " documents, " + with_commas(val_tokens) + " tokens in " +
         std::to_string(val_shards) + " shards; " + rate;
}

TokenizeSummary tokenize_files(const TokenizeOptions& o, const Tokenizer& tokenizer,
                               std::FILE* progress) {
  if (o.inputs.empty()) throw std::invalid_argument("tokenize needs at least one INPUT");
  if (o.output_dir.empty()) throw std::invalid_argument("tokenize needs --output-dir");
  if (o.shard_tokens < 1 || o.shard_tokens > INT32_MAX)
    throw std::invalid_argument("--shard-tokens must be between 1 and 2147483647");
  if (o.threads < 0) throw std::invalid_argument("--threads must be >= 0 (0 = all cores)");
  const std::string doc_text =
      o.doc_token.empty() ? tokenizer.default_document_token().value_or("") : o.doc_token;
  if (doc_text.empty()) {
    throw std::invalid_argument("tokenizer '" + tokenizer.source() +
                                "' has neither <|begin_of_text|> nor <|endoftext|>; name the "
                                "token that starts each document with --doc-token");
  }
  const auto doc_id = tokenizer.find(doc_text);
  if (!doc_id)
    throw std::invalid_argument("--doc-token '" + doc_text + "' is not a token of '" +
                                tokenizer.source() + "'");
  const bool wide = tokenizer.vocab_size() > 65536;
  const auto files = list_inputs(o.inputs);
  std::uint64_t total_bytes = 0;
  for (const auto& f : files)
    total_bytes += f.size;
  const std::string name =
      o.name.empty() ? std::filesystem::path(o.inputs.front()).filename().stem().string() : o.name;
  if (o.name.empty() && (name.empty() || name[0] == '.')) {
    throw DataError("the shards are named after the first input, but '" + o.inputs.front() +
                    "' gives no plain name ('" + name + "'); pass --name PREFIX");
  }

  ShardOutput out(o.output_dir, name, o.force);
  SplitWriter train(out, "train", o.shard_tokens, wide), val(out, "val", o.shard_tokens, wide);
  TokenizeSummary sum;
  const auto start = Clock::now();
  auto last_draw = start;
  ChunkReader reader(files, o.chunk_bytes);
  Encoders encoders([&] { return Encoder(tokenizer); });
  const int threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  tbb::task_arena arena(std::max(1, threads));

  const auto read = [&](tbb::flow_control& fc) -> std::shared_ptr<Chunk> {
    auto c = reader.next();
    if (!c) {
      fc.stop();
      return nullptr;
    }
    return std::make_shared<Chunk>(std::move(*c));
  };
  const auto encode = [&](std::shared_ptr<Chunk> c) -> std::shared_ptr<Encoded> {
    auto e = std::make_shared<Encoded>();
    e->bytes = c->bytes.size();
    for_each_document(*c, o.text_field, [&](std::string_view doc) {
      const std::size_t before = e->tokens.size();
      e->tokens.push_back(*doc_id);
      // A long document (a .txt file) is cut into chunks for every thread; the rest is one task.
      try {
        if (doc.size() >= 2 * o.chunk_bytes) {
          encode_parallel(tokenizer, encoders, doc, e->tokens, o.chunk_bytes);
        } else {
          encoders.local().encode(doc, e->tokens);
        }
      } catch (const DataError& err) {  // from inside the tokenizer: say which file and tokenizer
        throw DataError("a document of '" + c->file->path + "' with tokenizer '" +
                        tokenizer.source() + "': " + err.what());
      }
      e->lengths.push_back(static_cast<std::uint32_t>(e->tokens.size() - before));
    });
    return e;
  };
  const auto write = [&](std::shared_ptr<Encoded> e) {
    const std::uint32_t* t = e->tokens.data();
    for (const std::uint32_t n : e->lengths) {
      (sum.documents < o.val_docs ? val : train).add(t, n);
      t += n;
      ++sum.documents;
    }
    sum.bytes += e->bytes;
    const auto now = Clock::now();
    if (progress && now - last_draw > std::chrono::milliseconds(500)) {
      last_draw = now;
      const double s = std::chrono::duration<double>(now - start).count();
      const double rate = double(sum.bytes) / s;
      std::fprintf(progress, "\rtokenize: %s documents, %s tokens, %.1f MB/s, ETA %s   ",
                   with_commas(sum.documents).c_str(),
                   with_commas(train.tokens() + val.tokens()).c_str(), rate / 1e6,
                   duration(double(total_bytes - std::min(total_bytes, sum.bytes)) / rate).c_str());
      std::fflush(progress);
    }
  };
  arena.execute([&] {
    tbb::parallel_pipeline(
        static_cast<std::size_t>(4 * arena.max_concurrency()),
        tbb::make_filter<void, std::shared_ptr<Chunk>>(tbb::filter_mode::serial_in_order, read) &
            tbb::make_filter<std::shared_ptr<Chunk>, std::shared_ptr<Encoded>>(
                tbb::filter_mode::parallel, encode) &
            tbb::make_filter<std::shared_ptr<Encoded>, void>(tbb::filter_mode::serial_in_order,
                                                             write));
  });
  if (progress) std::fputs("\r\033[K", progress);
  if (sum.documents == 0) throw DataError("the inputs hold no documents");
  if (o.val_docs > 0 && sum.documents <= o.val_docs) {
    throw DataError("--val-docs " + std::to_string(o.val_docs) +
                    " leaves no training documents (the inputs hold " +
                    std::to_string(sum.documents) + ")");
  }
  train.flush();
  val.flush();
  out.commit();
  sum.val_documents = std::min(o.val_docs, sum.documents);
  sum.train_tokens = train.tokens();
  sum.val_tokens = val.tokens();
  sum.train_shards = out.shards("train");
  sum.val_shards = out.shards("val");
  sum.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return sum;
}

}  // namespace zo::tokenize
