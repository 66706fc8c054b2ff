// Tokenizer throughput: the tokenizer's load time; MB of text per second through
// `tokenize_files` on all cores (reading, encoding, writing shards), alone and with the load (what
// `offload_train tokenize` takes end to end); the same text again as one .txt document (one
// document split over the threads); and on one core (a fresh Encoder, so the word cache starts
// empty, as in a real run). The figures docs/performance.md records.
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tokenize/corpus.h"
#include "tokenize/tokenize_files.h"
#include "tokenize/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
namespace tk = zo::tokenize;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// tokenize_files over `inputs` into a scratch directory; prints its rates, the load included too.
void all_cores(const tk::Tokenizer& tok, const std::vector<std::string>& inputs, int threads,
               double load_s, const char* what) {
  const auto out = fs::temp_directory_path() / ("bench_tokenize_" + std::to_string(::getpid()));
  tk::TokenizeOptions o;
  o.inputs = inputs;
  o.output_dir = out.string();
  o.threads = threads;
  const auto sum = tk::tokenize_files(o, tok, nullptr);
  fs::remove_all(out);
  const int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  const double mb = static_cast<double>(sum.bytes) / 1e6;
  std::printf(
      "%d threads, %s: %.1f MB/s, %.1f MB/s per thread; with the load (load + read + encode + "
      "write, %.2f s) %.1f MB/s\n  %s\n",
      n, what, mb / sum.seconds, mb / sum.seconds / n, load_s + sum.seconds,
      mb / (load_s + sum.seconds), sum.summary_line().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = Clock::now();
  CLI::App app{"bench_tokenize: tokenizer load time and throughput, all cores and one core"};
  std::string tokenizer;
  std::vector<std::string> inputs;
  int threads = 0;
  app.add_option("--tokenizer", tokenizer, "tokenizer.json or GPT-2's directory")->required();
  app.add_option("--threads", threads, "threads for the all-cores runs; 0 = all");
  app.add_option("inputs", inputs, ".txt / .jsonl files or directories")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto t0 = Clock::now();
    const auto tok = tk::Tokenizer::load(tokenizer);
    const double load_s = seconds_since(t0);
    std::printf("load: %s in %.3f s (vocab %u; %.3f s since the process started)\n",
                tokenizer.c_str(), load_s, tok->vocab_size(), seconds_since(start));

    // All cores, the whole subcommand's path: the inputs as given.
    all_cores(*tok, inputs, threads, load_s, "the inputs (tokenize_files)");

    // The same documents' text, one after another (a newline between), as one .txt document.
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
    const auto txt = fs::temp_directory_path() /
                     ("bench_tokenize_" + std::to_string(::getpid()) + "_one_document.txt");
    {
      std::ofstream f(txt, std::ios::binary);
      for (std::size_t i = 0; i < docs.size(); ++i)
        f << (i > 0 ? "\n" : "") << docs[i];
      if (!f) throw std::runtime_error("cannot write " + txt.string());
    }
    all_cores(*tok, {txt.string()}, threads, load_s, "the same text as one .txt document");
    fs::remove(txt);

    // One core: every document through one Encoder.
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
    std::printf(
        "1 thread (one Encoder): %.1f MB in %.2f s: %.1f MB/s, %.2f M tokens/s (%.2f "
        "bytes/token)\n",
        mb, s1, mb / s1, mtok / s1, mb / mtok);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
