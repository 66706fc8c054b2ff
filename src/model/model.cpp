#include "model/model.h"

#include <stdexcept>
#include <string>

#include "model/gpt.h"
#include "model/llama.h"

namespace zo::model {

void* FlatParameters::grad(std::size_t offset) {
  return grads_ + offset * esize_;
}

void Model::forward(const void* params, int t, bool with_targets, float dloss_scale,
                    dev::Stream& s) {
  FlatParameters flat(params, nullptr, act_);
  forward(flat, t, with_targets, dloss_scale, s);
}

void Model::backward(const void* params, void* grads, dev::Stream& s) {
  FlatParameters flat(params, grads, act_);
  backward(flat, s);
}

void Model::decode(ParameterStore& store, int pos, dev::Stream& s) {
  const ModelShape& sh = shape();
  if (sh.B != 1 || sh.recompute) {
    throw std::logic_error("decode needs a model of micro-batch 1 without recompute (micro-batch " +
                           std::to_string(sh.B) + (sh.recompute ? ", recompute)" : ")"));
  }
  if (pos < 0 || pos >= sh.T || pos > cached_) {
    throw std::invalid_argument("decode at position " + std::to_string(pos) +
                                ": need 0 <= pos < T = " + std::to_string(sh.T) +
                                " and pos <= the " + std::to_string(cached_) +
                                " positions cached (forward over the prompt first)");
  }
  run(store, RowSpan::step(pos), s);
  cached_ = pos + 1;
}

void Model::decode(const void* params, int pos, dev::Stream& s) {
  FlatParameters flat(params, nullptr, act_);
  decode(flat, pos, s);
}

void Model::forwarded(int t) {
  cached_ = shape().B == 1 && !shape().recompute ? t : 0;
}

void check_shape(const ModelSpec& spec, const ModelShape& shape) {
  if (shape.B <= 0 || shape.T <= 0 || shape.T > spec.block_size) {
    throw std::invalid_argument("micro-batch " + std::to_string(shape.B) + " x sequence length " +
                                std::to_string(shape.T) +
                                " is invalid: need B >= 1 and 1 <= T <= block_size = " +
                                std::to_string(spec.block_size));
  }
}

void check_forward_positions(const ModelShape& shape, int t) {
  if (t < 1 || t > shape.T || (t < shape.T && shape.B != 1)) {
    throw std::invalid_argument("forward over " + std::to_string(t) +
                                " positions: need 1 <= t <= " + std::to_string(shape.T) +
                                " (t < T only with micro-batch 1)");
  }
}

std::unique_ptr<Model> make_model(dev::Device& device, const ParameterLayout& layout,
                                  const ModelShape& shape) {
  if (layout.spec().llama()) return std::make_unique<Llama>(device, layout, shape);
  return std::make_unique<Gpt>(device, layout, shape);
}

std::size_t activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                             std::size_t act_elem_bytes, int logits_stride) {
  if (spec.llama()) return llama_activation_bytes(spec, shape, act_elem_bytes, logits_stride);
  return gpt_activation_bytes(spec, shape, act_elem_bytes, logits_stride);
}

}  // namespace zo::model
