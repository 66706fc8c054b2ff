#include "common_options.h"

namespace zo::cli {

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

}  // namespace zo::cli
