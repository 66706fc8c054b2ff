// `offload_train sample` on the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common_options.h"
#include "train/sample.h"

namespace zo::cli {

struct SampleCommand {
  CLI::App* app = nullptr;
  train::SampleConfig config;  // the prompt is filled in by run_sample
  ByteSize device_memory;
  std::string prompt = "\n", prompt_tokens, tokenizer;
  bool print_ids = false, timing = false;
};

// Declares the subcommand and its flags on `app`; model_help describes --model.
void add_sample_command(CLI::App& app, SampleCommand& cmd, const std::string& model_help);

// Runs it: the new tokens (text, or ids) on stdout, with --timing one line on stderr.
int run_sample(SampleCommand& cmd);

}  // namespace zo::cli
