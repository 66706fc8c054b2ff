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

// Why `s` is not a plain decimal integer of 64 bits ("" if it is): an optional sign (a minus only
// where `is_signed`), digits with no leading zero (0 itself aside).
std::string not_plain_decimal(const std::string& s, bool is_signed) {
  const std::size_t sign = s.starts_with('+') || (is_signed && s.starts_with('-')) ? 1 : 0;
  if (s.size() <= sign || s.find_first_not_of("0123456789", sign) != std::string::npos)
    return is_signed ? "not a whole number in decimal" : "not a whole number from 0 in decimal";
  if (s[sign] == '0' && s.size() > sign + 1) return "a number with a leading zero (read as octal)";
  const char* end = s.data() + s.size();
  std::from_chars_result r;
  if (is_signed) {
    std::int64_t v = 0;
    r = std::from_chars(s.data() + (s[0] == '+' ? 1 : 0), end, v);
  } else {
    std::uint64_t v = 0;
    r = std::from_chars(s.data() + sign, end, v);
  }
  return r.ec == std::errc() && r.ptr == end ? "" : "out of range";
}

}  // namespace

void check_option_values(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    // An empty value is an unset shell variable far more often than a choice: `--init-from ""`
    // trained from scratch, `--resume ""` started afresh.
    if (o->count() > 0 && o->get_expected_min() > 0 && !o->get_positional()) {
      for (const std::string& v : o->results()) {
        if (v.empty())
          throw CLI::ValidationError(o->get_name(),
                                     "is empty; give a value, or leave the flag out for its "
                                     "default");
      }
    }
    // CLI11's names of integer types, with a validator's description after a colon.
    const std::string type = o->get_type_name();
    const bool is_signed = type.starts_with("INT"), is_unsigned = type.starts_with("UINT");
    if (o->count() == 0 || (!is_signed && !is_unsigned)) continue;
    for (const std::string& v : o->results()) {
      if (const std::string why = not_plain_decimal(v, is_signed); !why.empty())
        throw CLI::ValidationError(o->get_name(),
                                   "'" + v + "' is " + why + "; give plain decimal digits");
    }
  }
  for (const CLI::App* sub : app.get_subcommands())  // the parsed ones
    check_option_values(*sub);
}

}  // namespace zo::cli
