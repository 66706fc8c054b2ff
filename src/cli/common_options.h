// Flags several subcommands share, declared once so that they read alike everywhere.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

#include "core/bytes.h"
#include "train/inference.h"

namespace zo::cli {

// Bytes given as text ("512MiB") on the command line (add_size_option): 0 when not given, else
// parse_bytes' count (at least 1), its errors naming the flag. Given but empty is an error, not
// "not given".
struct ByteSize {
  std::string text;
  std::string flag;               // e.g. "--host-memory"
  CLI::Option* option = nullptr;  // the flag's, once declared
  bool given() const { return option != nullptr && option->count() > 0; }
  std::size_t bytes() const { return given() ? parse_bytes(text, flag) : 0; }
};

// Declares `flag` (e.g. "--host-memory") reading into `size`.
CLI::Option* add_size_option(CLI::App* app, const std::string& flag, ByteSize& size,
                             const std::string& help);

// --checkpoint, --checkpoint-dir, --init-from and --model: the weights `eval` and `sample` run.
void add_weights_options(CLI::App* app, train::WeightsSource& weights,
                         const std::string& model_help);

// --device and --precision.
void add_device_options(CLI::App* app, std::string& device, std::string& precision);

// --device-memory and --param-window of eval and sample (train::InferenceModel).
void add_inference_memory_options(CLI::App* app, ByteSize& device_memory, int& param_window);

// No option given to a parsed (sub)command is empty, and every integer is plain decimal and in
// its type's range. CLI11 reads integers with strtoll's base 0, so "010" was 8 and "0x10" 16, and
// an unsigned flag took "-1" as 2^64 - 1. Throws CLI::ValidationError naming the flag.
void check_option_values(const CLI::App& app);

}  // namespace zo::cli
