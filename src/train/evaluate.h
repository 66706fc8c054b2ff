// Validation loss: the mean next-token cross-entropy over a loader's batches. The training loop
// evaluates with it (Session::evaluate), and `offload_train eval` scores a checkpoint or Hugging
// Face weights on data without training.
#pragma once

#include <cstdint>
#include <string>

#include "data/loader.h"
#include "device/device.h"
#include "model/model.h"
#include "model/parameter_store.h"
#include "train/inference.h"

namespace zo::train {

// Batches whose losses sum_losses holds in flight at most.
inline constexpr int kEvalWindow = 16;

// The sum of the per-token losses of `batches` batches from `loader` (from where its cursor is),
// and how many losses that is. Memory does not grow with `batches`: at most kEvalWindow batches
// of losses are in flight, then summed in order.
struct LossSum {
  double sum = 0.0;
  double count = 0.0;
  // The first non-finite loss, as (batch, row of B x T), when there is one.
  std::int64_t nonfinite_batch = -1, nonfinite_row = -1;
};
LossSum sum_losses(model::Model& model, model::ParameterStore& params, data::DataLoader& loader,
                   int batches, dev::Device& dev, dev::Stream& s);

// offload_train eval.
struct EvalConfig {
  WeightsSource weights;
  std::string data;  // as train's --data
  std::string data_format = "auto";
  double val_fraction = 0.05;  // the tail of each document scored, as train holds out; 1: all
  int micro_batch = 4;
  int seq_len = 0;  // 0: the model's block_size, at most kDefaultEvalSeqLen
  int batches = 0;  // 0: one pass over the split
  std::string device = "auto";
  std::string precision = "auto";
  int threads = 0;
  std::size_t device_memory = 0;  // bytes the device may use; 0 = all
  int param_window = 0;           // InferenceModel's: 0 = every weight on the device if it fits
};

struct EvalResult {
  double loss = 0.0;  // mean cross-entropy, nats per token
  std::int64_t batches = 0, tokens = 0;
  std::string split;    // the loader's description of what was read
  std::string device;   // Device::name()
  std::string weights;  // the file scored (a checkpoint's model.safetensors)
};

// The default sequence length's cap (a Llama 3's block_size is 131072).
inline constexpr int kDefaultEvalSeqLen = 2048;

// Checks everything (flags, the spec, the data) before loading the weights and opening the
// device; refuses --batches beyond one pass and a non-finite loss (naming its batch and token).
EvalResult evaluate(const EvalConfig& config);

}  // namespace zo::train
