#include "train/inference.h"

#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>

#include "core/bytes.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "offload/windowed_parameters.h"
#include "train/checkpoint_io.h"
#include "train/finite_weights.h"
#include "train/plan.h"

namespace zo::train {

namespace {

void check_one_source(const WeightsSource& s) {
  if (s.checkpoint.empty() == s.init_from.empty())
    throw std::invalid_argument("give exactly one of --checkpoint or --init-from");
  // A checkpoint names its own model; --model would be ignored, so it is refused.
  if (!s.checkpoint.empty() && !s.model.empty()) {
    throw std::invalid_argument("--model '" + s.model + "' with --checkpoint '" + s.checkpoint +
                                "': a checkpoint runs the model it was trained as, so --model "
                                "applies to --init-from only; drop --model");
  }
}

}  // namespace

WeightsSource pin_checkpoint(WeightsSource source) {
  check_one_source(source);
  if (!source.checkpoint.empty()) {
    source.checkpoint =
        resolve_checkpoint(source.checkpoint, source.checkpoint_dir, "--checkpoint").string();
  }
  return source;
}

model::ModelSpec load_spec(const WeightsSource& s) {
  check_one_source(s);
  if (!s.checkpoint.empty())
    return checkpoint_spec(
        read_trainer_state(resolve_checkpoint(s.checkpoint, s.checkpoint_dir, "--checkpoint"),
                           CheckpointUse::kWeights));
  return model::load_model_spec(s.model.empty() ? init_from_config(s.init_from) : s.model);
}

InferenceModel::InferenceModel(const WeightsSource& source, const model::ModelSpec& spec,
                               const dev::DeviceRequest& request, const model::ModelShape& shape,
                               const std::string& smaller, int param_window)
    : layout_(spec), dev_(dev::make_device(request)), stream_(dev_->create_stream()) {
  check_one_source(source);
  const DType act = dev_->act_dtype();
  const std::size_t esize = dtype_size(act), bytes = layout_.size() * esize;
  // Every weight on the device, unless asked otherwise or they and the activations do not fit.
  const std::size_t capacity = dev_->capacity_bytes(), used = dev_->used_bytes();
  const std::size_t need = bytes + model::activation_bytes(spec, shape, esize);
  window_ = param_window != 0                         ? param_window
            : capacity != 0 && need > capacity - used ? default_param_window(spec)
                                                      : 0;
  if (window_ != 0 && (window_ < 2 || window_ > spec.n_layer)) {
    throw std::invalid_argument("--param-window must be in 2.." + std::to_string(spec.n_layer) +
                                " (the model's blocks), or 0 to choose");
  }

  // The weights, piece by piece, into the host copy in the act dtype.
  const std::filesystem::path dir =
      source.checkpoint.empty()
          ? std::filesystem::path()
          : resolve_checkpoint(source.checkpoint, source.checkpoint_dir, "--checkpoint");
  file_ = source.checkpoint.empty() ? std::filesystem::path(source.init_from)
                                    : dir / "model.safetensors";
  const std::filesystem::path& file = file_;
  try {
    host_ = pinned::PinnedBuffer(bytes, dev::staging_pin_options(*dev_, true));
  } catch (const HostMemoryError& e) {
    // Its own advice is training's (the optimizer state); here only the model and its dtype
    // decide the size of the one host copy.
    throw HostMemoryError("out of host memory for the weights of " + spec.name + " in " +
                              std::string(dtype_name(act)) + " (" + format_bytes(bytes) +
                              ", one copy of the whole model that sample and eval hold in " +
                              "host memory): " + e.facts() + " Use a smaller model" +
                              (act == DType::kF32 && dev_->backend() == dev::Backend::kCuda
                                   ? ", --precision bf16 or fp16 (half the bytes)"
                                   : "") +
                              ", or a host with more memory",
                          e.requested_bytes(), e.available_bytes());
  }
  std::string bad;
  model::import_hf_weights(file, layout_, [&](std::size_t offset, std::span<const float> v) {
    if (bad.empty()) bad = first_nonfinite_weight(layout_, offset, v, act);
    convert_from_float(v.data(), static_cast<char*>(host_.data()) + offset * esize, act, v.size());
  });
  if (!bad.empty()) {
    const std::string from = source.checkpoint.empty() ? "--init-from '" + source.init_from + "'"
                                                       : "checkpoint '" + dir.string() + "'";
    throw std::invalid_argument(from + " holds weights that are not finite in " +
                                std::string(dtype_name(act)) + ": " + bad +
                                "; what they compute would be NaN. Use an earlier checkpoint "
                                "(or, for a value beyond fp16's range, --precision bf16)");
  }
  try {
    if (window_ == 0) {
      params_ = dev_->alloc(bytes, "parameters");
      dev_->copy_to_device(params_.data(), host_.data(), bytes, *stream_);
      stream_->synchronize();  // the host copy goes (and the upload is not a step's time)
      host_ = pinned::PinnedBuffer();
      store_ = std::make_unique<model::FlatParameters>(params_.data(), nullptr, act);
    } else {
      store_ = std::make_unique<offload::WindowedParameters>(*dev_, *stream_, layout_, host_.data(),
                                                             window_);
    }
    model_ = model::make_model(*dev_, layout_, shape);
  } catch (const OutOfMemoryError& e) {
    // Its own advice is training's (--recompute, --device-memory); here only the shape and the
    // window help.
    const std::string weights =
        window_ == 0 ? "the weights (" + format_bytes(bytes) + ")"
                     : "a window of " + std::to_string(window_) + " blocks of the weights";
    throw std::runtime_error("out of device memory for " + weights + " and the activations of " +
                             std::to_string(shape.B) + " x " + std::to_string(shape.T) +
                             " positions: requested " + format_bytes(e.requested()) + " with " +
                             format_bytes(e.in_use()) + " in use; use " + smaller +
                             (window_ == 0
                                  ? ", --param-window 2 (the blocks stream through the device)"
                              : window_ > 2 ? ", a smaller --param-window"
                                            : "") +
                             ", or --device host");
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
