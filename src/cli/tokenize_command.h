// `offload_train tokenize` on the command line.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenize/tokenize_files.h"

namespace zo::cli {

struct TokenizeCommand {
  CLI::App* app = nullptr;
  std::string tokenizer;
  tokenize::TokenizeOptions options;
};

// Declares the subcommand and its flags on `app`.
void add_tokenize_command(CLI::App& app, TokenizeCommand& cmd);

// Runs it: a progress line on stderr when that is a terminal, the summary on stdout.
int run_tokenize(const TokenizeCommand& cmd);

}  // namespace zo::cli
