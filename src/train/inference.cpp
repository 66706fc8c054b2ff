#include "train/inference.h"

#include <cstdint>
#include <filesystem>
#include <stdexcept>

#include "core/bytes.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "train/checkpoint_io.h"
#include "train/finite_weights.h"

namespace zo::train {

namespace {

void check_one_source(const WeightsSource& s) {
  if (s.checkpoint.empty() == s.init_from.empty())
    throw std::invalid_argument("give exactly one of --checkpoint or --init-from");
}

}  // namespace

model::ModelSpec load_spec(const WeightsSource& s) {
  check_one_source(s);
  if (!s.checkpoint.empty())
    return checkpoint_spec(read_trainer_state(resolve_checkpoint(s.checkpoint, s.checkpoint_dir)));
  return model::load_model_spec(s.model.empty() ? init_from_config(s.init_from) : s.model);
}

LoadedWeights load_weights(const WeightsSource& s) {
  return load_weights(s, load_spec(s));
}

LoadedWeights load_weights(const WeightsSource& s, const model::ModelSpec& spec) {
  LoadedWeights w{spec, {}, {}};
  const model::ParameterLayout layout(w.spec);
  w.weights.resize(layout.size());
  const std::filesystem::path dir =
      s.checkpoint.empty() ? "" : resolve_checkpoint(s.checkpoint, s.checkpoint_dir);
  const std::filesystem::path file =
      s.checkpoint.empty() ? std::filesystem::path(s.init_from) : dir / "model.safetensors";
  w.source = s.checkpoint.empty() ? "--init-from '" + s.init_from + "'"
                                  : "checkpoint '" + dir.string() + "'";
  model::import_hf_weights(file, layout, w.weights);
  return w;
}

InferenceModel::InferenceModel(const LoadedWeights& w, const dev::DeviceRequest& request,
                               const model::ModelShape& shape, const std::string& smaller)
    : layout_(w.spec), dev_(dev::make_device(request)), stream_(dev_->create_stream()) {
  const DType act = dev_->act_dtype();
  if (const std::string bad = first_nonfinite_weight(layout_, 0, w.weights, act); !bad.empty()) {
    throw std::invalid_argument(w.source + " holds weights that are not finite in " +
                                std::string(dtype_name(act)) + ": " + bad +
                                "; what they compute would be NaN. Use an earlier checkpoint "
                                "(or, for a value beyond fp16's range, --precision bf16)");
  }
  const std::size_t bytes = w.weights.size() * dtype_size(act);
  std::vector<std::uint8_t> staged(bytes);  // the weights in the act dtype
  convert_from_float(w.weights.data(), staged.data(), dev_->act_dtype(), w.weights.size());
  try {
    params_ = dev_->alloc(bytes, "parameters");
    dev_->copy_to_device(params_.data(), staged.data(), bytes, *stream_);
    stream_->synchronize();  // staged goes out of scope (and the upload is not a step's time)
    model_ = model::make_model(*dev_, layout_, shape);
  } catch (const OutOfMemoryError& e) {
    // Its own advice is training's (--recompute, --device-memory); here only the shape helps.
    throw std::runtime_error("out of device memory for the weights (" + format_bytes(bytes) +
                             ") and the activations of " + std::to_string(shape.B) + " x " +
                             std::to_string(shape.T) + " positions: requested " +
                             format_bytes(e.requested()) + " with " + format_bytes(e.in_use()) +
                             " in use; use " + smaller + ", or --device host");
  }
}

InferenceModel::~InferenceModel() {
  dev::synchronize_quietly(*stream_);
}

std::string nonfinite_logits_advice(DType act) {
  const std::string cause =
      "the weights hold Inf or NaN, or overflow in " + std::string(dtype_name(act)) + "; ";
  return cause + (act == DType::kF32 ? "check the weights (a checkpoint of a diverged run?)"
                                     : "try --precision fp32, or check the weights");
}

}  // namespace zo::train
