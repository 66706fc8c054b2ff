// Flags several subcommands share, declared once so that they read alike everywhere.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

#include "core/bytes.h"
#include "train/inference.h"

namespace zo::cli {

// Bytes given as text ("512MiB") on the command line; 0 when not given.
struct ByteSize {
  std::string text;
  std::size_t bytes() const { return text.empty() ? 0 : parse_bytes(text); }
};

// --checkpoint, --checkpoint-dir, --init-from and --model: the weights `eval` and `sample` run.
void add_weights_options(CLI::App* app, train::WeightsSource& weights,
                         const std::string& model_help);

// --device and --precision.
void add_device_options(CLI::App* app, std::string& device, std::string& precision);

// --device-memory and --param-window of eval and sample (train::InferenceModel).
void add_inference_memory_options(CLI::App* app, ByteSize& device_memory, int& param_window);

}  // namespace zo::cli
