#include "eval_command.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common_options.h"

namespace zo::cli {

void add_eval_command(CLI::App& app, EvalCommand& cmd, const std::string& model_help) {
  auto* ev = cmd.app = app.add_subcommand(
      "eval", "Score a checkpoint or Hugging Face weights on data: mean loss and perplexity");
  train::EvalConfig& c = cmd.config;
  add_weights_options(ev, c.weights, model_help);
  ev->add_option("--data", c.data,
                 "token shards (file, directory, glob), text files, or 'synthetic'")
      ->required();
  ev->add_option("--data-format", c.data_format, "auto, shards, text or synthetic")
      ->capture_default_str();
  ev->add_option("--val-fraction", c.val_fraction,
                 "tail of each document scored, as train holds it out; 1 = all of each document")
      ->capture_default_str();
  ev->add_option("--micro-batch,-b", c.micro_batch, "sequences per batch (B)")
      ->capture_default_str();
  ev->add_option("--seq-len", c.seq_len,
                 "tokens per sequence (T); default the model's block_size, at most 2048");
  ev->add_option("--batches", c.batches, "batches to score; 0 = one pass over the scored tokens")
      ->capture_default_str();
  add_device_options(ev, c.device, c.precision);
  add_inference_memory_options(ev, cmd.device_memory, c.param_window);
  ev->add_flag("--json", cmd.json, "print one JSON object");
}

int run_eval(const EvalCommand& cmd) {
  train::EvalConfig c = cmd.config;
  c.device_memory = cmd.device_memory.bytes();
  const train::EvalResult r = train::evaluate(c);
  const double ppl = std::exp(r.loss);  // inf past a loss of about 709.8
  if (cmd.json) {
    // JSON has no infinity: a perplexity that overflows a double is null.
    const nlohmann::json j = {
        {"loss", r.loss},       {"perplexity", std::isfinite(ppl) ? nlohmann::json(ppl) : nullptr},
        {"batches", r.batches}, {"tokens", r.tokens},
        {"data", r.split},      {"device", r.device},
        {"weights", r.weights}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "eval: loss %.4f, perplexity %.2f over %lld tokens in %lld batch%s (%s) on %s; weights "
        "%s\n",
        r.loss, ppl, static_cast<long long>(r.tokens), static_cast<long long>(r.batches),
        r.batches == 1 ? "" : "es", r.split.c_str(), r.device.c_str(), r.weights.c_str());
  }
  return 0;
}

}  // namespace zo::cli
