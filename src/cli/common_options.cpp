#include "common_options.h"

#include <charconv>
#include <cstdint>

namespace zo::cli {

CLI::Option* add_size_option(CLI::App* app, const std::string& flag, ByteSize& size,
                             const std::string& help) {
  size.flag = flag;
  return size.option = app->add_option(flag, size.text, help);
}

void add_weights_options(CLI::App* app, train::WeightsSource& w, const std::string& model_help) {
  app->add_option("--checkpoint", w.checkpoint, "checkpoint directory, or 'latest'");
  app->add_option("--checkpoint-dir", w.checkpoint_dir, "where to look for 'latest'");
  app->add_option("--init-from", w.init_from,
                  "Hugging Face weights: .safetensors, index or directory");
  app->add_option("--model", w.model,
                  model_help + "; with --init-from, default the config.json beside the weights");
}

void add_device_options(CLI::App* app, std::string& device, std::string& precision) {
  app->add_option("--device", device, "auto (cuda if a GPU is usable, else host), host or cuda")
      ->capture_default_str();
  app->add_option("--precision", precision,
                  "device dtype: auto (bf16 on cuda, fp32 on host), fp32, bf16 or fp16")
      ->capture_default_str();
}

void add_inference_memory_options(CLI::App* app, ByteSize& device_memory, int& param_window) {
  add_size_option(app, "--device-memory", device_memory,
                  "device memory to use, e.g. 24GiB (default: what is free; unlimited on the "
                  "host backend)");
  app->add_option("--param-window", param_window,
                  "keep the weights in host memory and stream the blocks through this many "
                  "device slots (>= 2); 0 = only when they do not fit the device")
      ->capture_default_str();
}

namespace {

// Decimal digits with no leading zero (0 itself aside), a minus sign only where `is_signed`, and
// a value the type's 64 bits hold.
bool plain_decimal(const std::string& s, bool is_signed) {
  const std::size_t digits = is_signed && s.starts_with('-') ? 1 : 0;
  if (s.size() <= digits || (s[digits] == '0' && s.size() > digits + 1)) return false;
  const char* end = s.data() + s.size();
  std::from_chars_result r;
  if (is_signed) {
    std::int64_t v = 0;
    r = std::from_chars(s.data(), end, v);
  } else {
    std::uint64_t v = 0;
    r = std::from_chars(s.data(), end, v);
  }
  return r.ec == std::errc() && r.ptr == end;
}

}  // namespace

void check_whole_numbers(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    if (o->count() == 0 || (type != "INT" && type != "UINT")) continue;
    for (const std::string& v : o->results()) {
      if (plain_decimal(v, type == "INT")) continue;
      throw CLI::ValidationError(o->get_name(), "'" + v + "' is not a whole number in decimal" +
                                                    (type == "UINT" ? " from 0" : "") +
                                                    " (no leading zeros, hex or octal; at most 2^" +
                                                    (type == "UINT" ? "64 - 1" : "63 - 1") + ")");
    }
  }
  for (const CLI::App* sub : app.get_subcommands())  // the parsed ones
    check_whole_numbers(*sub);
}

}  // namespace zo::cli
