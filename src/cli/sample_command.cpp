#include "sample_command.h"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common_options.h"
#include "tokenize/decode.h"
#include "tokenize/tokenizer.h"

namespace zo::cli {
namespace {

std::vector<std::int32_t> parse_token_list(const std::string& s) {
  // getline yields no item after a last comma: "1," would read as "1".
  if (!s.empty() && s.back() == ',') {
    throw std::invalid_argument("--prompt-tokens: '" + s +
                                "' ends with a comma (a missing id?); give ids such as 1,2,3");
  }
  std::vector<std::int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      // Out of 32 bits is refused, not truncated into some other id.
      if (pos != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::out_of_range(item);
      out.push_back(static_cast<std::int32_t>(v));
    } catch (const std::logic_error&) {
      throw std::invalid_argument("--prompt-tokens: '" + item +
                                  "' is not a token id (an integer below 2^31); give ids such "
                                  "as 1,2,3");
    }
  }
  return out;
}

}  // namespace

void add_sample_command(CLI::App& app, SampleCommand& cmd, const std::string& model_help) {
  auto* smp = cmd.app = app.add_subcommand("sample",
                                           "Generate tokens (or text, for byte-level models) "
                                           "from a checkpoint or Hugging Face weights");
  train::SampleConfig& sc = cmd.config;
  add_weights_options(smp, sc.weights, model_help);
  smp->add_option("--prompt", cmd.prompt,
                  "prompt text: bytes (byte-level models), or encoded with --tokenizer");
  smp->add_option("--prompt-tokens", cmd.prompt_tokens, "prompt as comma-separated token ids");
  smp->add_option("--tokens,-n", sc.new_tokens, "tokens to generate")->capture_default_str();
  smp->add_option("--temperature", sc.temperature, "0 = greedy")->capture_default_str();
  smp->add_option("--top-k", sc.top_k, "sample from the k most likely; 0 = all")
      ->capture_default_str();
  smp->add_option("--top-p", sc.top_p,
                  "nucleus: sample from the most likely tokens holding this probability; 1 = all")
      ->capture_default_str();
  smp->add_option("--seed", sc.seed, "sampling seed")->capture_default_str();
  add_device_options(smp, sc.device, sc.precision);
  add_inference_memory_options(smp, cmd.device_memory, sc.param_window);
  smp->add_option("--context", sc.context,
                  "positions kept (activations and KV cache); 0 = the model's block_size, at "
                  "most 2048")
      ->capture_default_str();
  smp->add_flag("--ids", cmd.print_ids, "print token ids instead of text");
  smp->add_flag("--timing", cmd.timing,
                "print the prefill's time and the tokens per second to stderr");
  smp->add_option("--tokenizer", cmd.tokenizer,
                  "tokenizer.json (or its directory) that encodes --prompt and decodes the output");
}

int run_sample(SampleCommand& cmd) {
  train::SampleConfig& sc = cmd.config;
  // One prompt: the other would be ignored.
  if (cmd.app->count("--prompt") > 0 && cmd.app->count("--prompt-tokens") > 0) {
    throw std::invalid_argument(
        "--prompt and --prompt-tokens both give the prompt: give one (--prompt for text, "
        "--prompt-tokens for token ids)");
  }
  sc.device_memory = cmd.device_memory.bytes();
  std::unique_ptr<tokenize::Tokenizer> tokenizer;
  if (!cmd.tokenizer.empty()) tokenizer = tokenize::Tokenizer::load(cmd.tokenizer);
  if (!cmd.prompt_tokens.empty()) {
    sc.prompt = parse_token_list(cmd.prompt_tokens);
  } else if (tokenizer) {
    const auto ids = tokenizer->encode(cmd.prompt);
    sc.prompt.assign(ids.begin(), ids.end());
  } else {
    for (unsigned char ch : cmd.prompt)
      sc.prompt.push_back(ch);
  }
  // Each token is printed as it is picked (flushed, so a pipe or terminal sees it at once).
  int vocab = 0;  // set by generate before the first token
  std::optional<tokenize::TextDecoder> text;
  if (tokenizer && !cmd.print_ids) text.emplace(*tokenizer);
  bool first = true;
  const auto print = [&](std::int32_t id) {
    std::string out;
    if (text) {
      out = text->push(id);
    } else if (!cmd.print_ids && cmd.prompt_tokens.empty() && vocab <= 256) {
      out = std::string(1, static_cast<char>(id));  // bytes of a byte-level model
    } else {
      out = (first ? "" : ",") + std::to_string(id);
    }
    first = false;
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0)
      throw std::runtime_error(std::string("cannot write the sample to stdout: ") +
                               std::strerror(errno));
  };
  train::SampleTimes times;
  try {
    train::generate(sc, &vocab, cmd.timing ? &times : nullptr, print);
  } catch (...) {
    if (!first) {  // the tokens so far end their line, before the error on stderr
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
    throw;
  }
  std::fputc('\n', stdout);
  if (cmd.timing) {
    std::fflush(stdout);
    std::fprintf(stderr, "sample: prefill of %d tokens in %.1f ms; ", times.prompt_tokens,
                 times.prefill_s * 1e3);
    if (times.decode_steps > 0 && times.decode_s > 0) {
      std::fprintf(stderr, "%d decode steps in %.3f s, %.1f tokens/s", times.decode_steps,
                   times.decode_s, times.decode_steps / times.decode_s);
    } else {
      std::fprintf(stderr, "no decode steps");
    }
    std::fprintf(stderr, " (%s)\n", times.device.c_str());
  }
  return 0;
}

}  // namespace zo::cli
