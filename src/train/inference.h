// A trained model on a device, for what runs it without training it (sample, eval): its weights
// read from a checkpoint or Hugging Face safetensors piece by piece into a host copy in the
// device's dtype (the only whole-model copy on the host), uploaded or streamed from there, and a
// Model of the asked shape over them. The flags are checked before the device is opened.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/make_device.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/spec.h"
#include "pinned_memory/pinned_buffer.h"

namespace zo::train {

// Where the weights come from: exactly one of checkpoint (a directory, or "latest" in
// checkpoint_dir) and init_from (Hugging Face weights; the model from `model`, else the
// config.json beside them).
struct WeightsSource {
  std::string checkpoint, checkpoint_dir;
  std::string init_from, model;
};

// `source` with its checkpoint resolved once ("latest" becomes the path it names), so that the
// spec and the weights come from the same checkpoint even while a run keeps saving.
WeightsSource pin_checkpoint(WeightsSource source);

// The model the weights are for (a checkpoint's trainer state, --model, or the config.json
// beside Hugging Face weights), without reading them.
model::ModelSpec load_spec(const WeightsSource& source);

// What to say when a model's logits are not finite: their causes and the fix, for act dtype
// `act` (sample and eval).
std::string nonfinite_logits_advice(DType act);

class InferenceModel {
 public:
  // The weights of `source` for `spec` (load_spec's). `smaller` names the flags that shrink
  // `shape`, for the out-of-memory message. Weights that are not finite in the device's dtype
  // are refused, naming the first. param_window >= 2: the host copy stays (page-locked) and the
  // blocks stream through that many device slots (offload/windowed_parameters.h); 0: every
  // weight on the device when the weights and the activations fit its capacity, else a window
  // of default_param_window.
  InferenceModel(const WeightsSource& source, const model::ModelSpec& spec,
                 const dev::DeviceRequest& request, const model::ModelShape& shape,
                 const std::string& smaller, int param_window = 0);
  // Whatever was enqueued finishes before the buffers it uses are freed, on every way out.
  ~InferenceModel();
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  dev::Device& device() { return *dev_; }
  dev::Stream& stream() { return *stream_; }
  model::Model& model() { return *model_; }
  model::ParameterStore& parameters() { return *store_; }
  int param_window() const { return window_; }  // 0: every weight on the device
  // The file the weights came from (a checkpoint's model.safetensors once "latest" is resolved).
  const std::filesystem::path& weights_file() const { return file_; }

 private:
  model::ParameterLayout layout_;
  std::unique_ptr<dev::Device> dev_;
  std::unique_ptr<dev::Stream> stream_;
  int window_ = 0;
  std::filesystem::path file_;
  dev::Buffer params_;         // (layout size) act dtype, without a window
  pinned::PinnedBuffer host_;  // (layout size) act dtype: the import, then a window's source
  std::unique_ptr<model::ParameterStore> store_;
  std::unique_ptr<model::Model> model_;
};

}  // namespace zo::train
