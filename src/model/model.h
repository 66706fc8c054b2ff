// A language model's forward and backward over the device interface: GPT-2 (gpt.h) or the Llama
// family (llama.h), chosen by the spec. The trainer, evaluation and sampling see only this.
// A model owns its activations and token buffers on the device; parameters and gradients belong
// to a ParameterStore (flat buffers, or the offload engine's uploads and gradient buckets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "device/device.h"
#include "model/layout.h"
#include "model/parameter_store.h"

namespace zo::model {

struct ModelShape {
  int B = 1;               // micro-batch
  int T = 1;               // sequence length (<= block_size)
  bool recompute = false;  // keep only each block's input; recompute the block in backward
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelShape& shape() const = 0;
  virtual const ParameterLayout& layout() const = 0;

  // Copies a batch (B*T tokens and targets; targets may be empty for inference) to the device
  // on stream s. The host vectors may be reused as soon as this returns.
  virtual void set_batch(const std::vector<std::int32_t>& tokens,
                         const std::vector<std::int32_t>& targets, dev::Stream& s) = 0;

  // Forward over the first t <= T positions of the batch. With targets, per-position losses are
  // computed; with dloss_scale != 0 the logits buffer is overwritten with dloss_scale * dL/dlogits
  // for the backward pass that must follow.
  virtual void forward(ParameterStore& store, int t, bool with_targets, float dloss_scale,
                       dev::Stream& s) = 0;
  void forward(const void* params, int t, bool with_targets, float dloss_scale, dev::Stream& s);

  // Accumulates (+=) the gradients of the last training forward into the store.
  virtual void backward(ParameterStore& store, dev::Stream& s) = 0;
  // The same into one flat buffer (layout.size(), act dtype).
  void backward(const void* params, void* grads, dev::Stream& s);

  // Device pointers for the last forward: losses (B*T fp32), logits (B*T rows of V act dtype,
  // logits_stride() elements apart; hold dlogits after a training forward).
  virtual const float* losses() const = 0;
  virtual const void* logits() const = 0;
  // The logits' row stride: V on the host backend, V rounded up to a multiple of 128 on CUDA.
  virtual int logits_stride() const = 0;

 protected:
  explicit Model(DType act) : act_(act) {}

 private:
  DType act_;  // of parameters, gradients and activations
};

// The model the layout's spec describes.
std::unique_ptr<Model> make_model(dev::Device& device, const ParameterLayout& layout,
                                  const ModelShape& shape);

// Bytes of device memory the model allocates for activations, scratch and token buffers, with
// the logits rows logits_stride elements apart; 0: the CUDA backend's padded stride, which
// bounds every device's.
std::size_t activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                             std::size_t act_elem_bytes, int logits_stride = 0);

// Throws std::invalid_argument unless 1 <= T <= block_size and B >= 1.
void check_shape(const ModelSpec& spec, const ModelShape& shape);

}  // namespace zo::model
