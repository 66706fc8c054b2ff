// `offload_train eval` on the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common_options.h"
#include "train/evaluate.h"

namespace zo::cli {

struct EvalCommand {
  CLI::App* app = nullptr;
  train::EvalConfig config;
  ByteSize device_memory;
  bool json = false;
};

// Declares the subcommand and its flags on `app`; model_help describes --model.
void add_eval_command(CLI::App& app, EvalCommand& cmd, const std::string& model_help);

// Runs it: one line (or one JSON object) on stdout.
int run_eval(const EvalCommand& cmd);

}  // namespace zo::cli
