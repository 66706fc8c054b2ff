// Tokenizer throughput: MB of text per second on one core (a fresh Encoder, so the word cache
// starts empty, as in a real run) and through `tokenize_files` on all cores (reading, encoding,
// writing shards), the figures docs/performance.md records.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tokenize/corpus.h"
#include "tokenize/tokenize_files.h"
#include "tokenize/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace tk = zo::tokenize;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_tokenize: tokenizer throughput, one core and all cores"};
  std::string tokenizer;
  std::vector<std::string> inputs;
  int threads = 0;
  app.add_option("--tokenizer", tokenizer, "tokenizer.json or GPT-2's directory")->required();
  app.add_option("--threads", threads, "threads for the all-cores run; 0 = all");
  app.add_option("inputs", inputs, ".txt / .jsonl files or directories")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto t0 = Clock::now();
    const auto tok = tk::Tokenizer::load(tokenizer);
    std::printf("loaded %s in %.2f s (vocab %u)\n", tokenizer.c_str(), seconds_since(t0),
                tok->vocab_size());

    // One core: every document of the inputs through one Encoder.
    const auto files = tk::list_inputs(inputs);
    std::vector<std::string> docs;
    std::uint64_t bytes = 0;
    tk::ChunkReader reader(files, 1 << 20);
    while (auto c = reader.next()) {
      tk::for_each_document(*c, "text", [&](std::string_view d) {
        docs.emplace_back(d);
        bytes += d.size();
      });
    }
    tk::Encoder enc(*tok);
    std::vector<std::uint32_t> ids;
    std::uint64_t tokens = 0;
    const auto t1 = Clock::now();
    for (const auto& d : docs) {
      ids.clear();
      enc.encode(d, ids);
      tokens += ids.size();
    }
    const double s1 = seconds_since(t1);
    const double mb = static_cast<double>(bytes) / 1e6, mtok = static_cast<double>(tokens) / 1e6;
    std::printf("1 thread: %.1f MB in %.2f s: %.1f MB/s, %.2f M tokens/s (%.2f bytes/token)\n", mb,
                s1, mb / s1, mtok / s1, mb / mtok);

    // All cores, the whole subcommand's path.
    const auto out =
        std::filesystem::temp_directory_path() / ("bench_tokenize_" + std::to_string(::getpid()));
    tk::TokenizeOptions o;
    o.inputs = inputs;
    o.output_dir = out.string();
    o.threads = threads;
    const auto sum = tk::tokenize_files(o, *tok, nullptr);
    std::filesystem::remove_all(out);
    const int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
    const double rate = static_cast<double>(sum.bytes) / 1e6 / sum.seconds;
    std::printf("%d threads (tokenize_files): %.1f MB/s, %.1f MB/s per thread; %s\n", n, rate,
                rate / n, sum.summary_line().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
