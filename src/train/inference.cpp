#include "train/inference.h"

#include <cstdint>
#include <stdexcept>

#include "core/dtype.h"
#include "model/hf_weights.h"
#include "train/checkpoint_io.h"

namespace zo::train {

LoadedWeights load_weights(const WeightsSource& s) {
  if (s.checkpoint.empty() == s.init_from.empty())
    throw std::invalid_argument("give exactly one of --checkpoint or --init-from");
  LoadedWeights w;
  if (!s.checkpoint.empty()) {
    const auto dir = resolve_checkpoint(s.checkpoint, s.checkpoint_dir);
    w.spec = checkpoint_spec(read_trainer_state(dir));
    w.weights.resize(model::ParameterLayout(w.spec).size());
    model::import_hf_weights(dir / "model.safetensors", model::ParameterLayout(w.spec), w.weights);
  } else {
    w.spec = model::load_model_spec(s.model.empty() ? init_from_config(s.init_from) : s.model);
    w.weights.resize(model::ParameterLayout(w.spec).size());
    model::import_hf_weights(s.init_from, model::ParameterLayout(w.spec), w.weights);
  }
  return w;
}

InferenceModel::InferenceModel(const LoadedWeights& w, const dev::DeviceRequest& request,
                               const model::ModelShape& shape)
    : layout_(w.spec), dev_(dev::make_device(request)), stream_(dev_->create_stream()) {
  const std::size_t bytes = w.weights.size() * dtype_size(dev_->act_dtype());
  std::vector<std::uint8_t> staged(bytes);  // the weights in the act dtype
  convert_from_float(w.weights.data(), staged.data(), dev_->act_dtype(), w.weights.size());
  params_ = dev_->alloc(bytes, "parameters");
  dev_->copy_to_device(params_.data(), staged.data(), bytes, *stream_);
  stream_->synchronize();  // staged goes out of scope (and the upload is not a step's time)
  model_ = model::make_model(*dev_, layout_, shape);
}

InferenceModel::~InferenceModel() {
  try {
    stream_->synchronize();
  } catch (const std::exception&) {  // the error was (or will be) reported by its op
  }
}

}  // namespace zo::train
