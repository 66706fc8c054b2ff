#include "model/model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/gpt.h"
#include "model/llama.h"

namespace zo::model {

const void* FlatParameters::param(std::size_t offset) {
  return params_ + offset * esize_;
}

void* FlatParameters::grad(std::size_t offset) {
  return grads_ + offset * esize_;
}

namespace {

// Throws std::invalid_argument unless a forward over t positions fits the shape (t < T only with
// micro-batch 1).
void check_forward_positions(const ModelShape& shape, int t) {
  if (t < 1 || t > shape.T || (t < shape.T && shape.B != 1)) {
    throw std::invalid_argument("forward over " + std::to_string(t) +
                                " positions: need 1 <= t <= " + std::to_string(shape.T) +
                                " (t < T only with micro-batch 1)");
  }
}

}  // namespace

Model::Model(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape)
    : device_(device),
      layout_(layout),
      shape_(shape),
      esize_(dtype_size(device.act_dtype())),
      Vp_(device.gemm_row_stride(layout.spec().vocab_size)) {
  check_shape(layout.spec(), shape);
  if (Vp_ < layout.spec().vocab_size) {
    throw std::logic_error("the device's GEMM row stride " + std::to_string(Vp_) +
                           " is less than the vocabulary " +
                           std::to_string(layout.spec().vocab_size));
  }
}

void* Model::at(const void* base, std::size_t elements) const {
  return const_cast<char*>(static_cast<const char*>(base)) + elements * esize_;
}

void Model::run(ParameterStore& store, const RowSpan& r, dev::Stream& s) {
  const ModelSpec& spec = layout_.spec();
  const int N = r.rows(), C = spec.n_embd, V = spec.vocab_size, L = spec.n_layer;
  const std::size_t final_group = std::size_t(L) + 1;
  store.before_read(0);
  embed_forward(store, r, s);
  for (int l = 0; l < L; ++l) {
    store.before_read(std::size_t(l) + 1);
    block_forward(store, l, r, false, s);
  }
  store.before_read(final_group);
  final_norm_forward(store, r, s);
  // The LM head; logits rows Vp_ apart (the device's GEMM stride), only the first V columns used.
  const std::size_t head = layout_.lm_head(), head_group = layout_.group_of(head);
  if (head_group != final_group) store.before_read(head_group);  // tied to the embedding
  device_.matmul_forward(at(logits_, std::size_t(r.row0) * Vp_), at(lnf_, std::size_t(r.row0) * C),
                         store.param(head), nullptr, {N, C, V, Vp_}, s);
}

void Model::backward_pass(ParameterStore& store, int t, dev::Stream& s) {
  const ModelSpec& spec = layout_.spec();
  const int N = shape_.B * t, C = spec.n_embd, V = spec.vocab_size, L = spec.n_layer;
  const std::size_t head = layout_.lm_head(), head_group = layout_.group_of(head);
  // Activation gradients are written, not accumulated into zeroed buffers (device.h).
  store.before_read(head_group);
  device_.matmul_backward(dlnf_, store.grad(head), nullptr, logits_, lnf_, store.param(head),
                          {N, C, V, Vp_}, s);
  if (head_group != std::size_t(L) + 1) store.before_read(std::size_t(L) + 1);
  final_norm_backward(store, t, s);
  store.complete_from(layout_.lnf_w());
  for (int l = L - 1; l >= 0; --l) {
    store.before_read(std::size_t(l) + 1);
    if (shape_.recompute) block_forward(store, l, RowSpan::whole(shape_.B, t), true, s);
    block_backward(store, l, t, s);
  }
  embed_backward(store, t, s);
  store.complete_from(0);
}

void Model::set_batch(const std::vector<std::int32_t>& tokens,
                      const std::vector<std::int32_t>& targets, dev::Stream& s) {
  batch_->set(tokens, targets, s);
}

void Model::set_token(int pos, std::int32_t token, dev::Stream& s) {
  batch_->set_token(static_cast<std::size_t>(pos), token, s);
}

void Model::forward(ParameterStore& store, int t, bool with_targets, float dloss_scale,
                    dev::Stream& s) {
  check_forward_positions(shape_, t);
  t_ = t;
  grads_ready_ = with_targets && dloss_scale != 0.0f;
  cached_ = shape_.B == 1 && !shape_.recompute ? t : 0;
  const bool training = grads_ready_;
  const GraphKey key{false, store.params(), nullptr, t, with_targets, dloss_scale};
  run_recorded(store, key, s, [&] {
    run(store, RowSpan::whole(shape_.B, t), s);
    if (with_targets) {
      device_.cross_entropy(losses_, training ? logits_ : nullptr, logits_, batch_->targets(),
                            shape_.B * t, layout_.spec().vocab_size, Vp_, dloss_scale, s);
    }
  });
}

void Model::forward(const void* params, int t, bool with_targets, float dloss_scale,
                    dev::Stream& s) {
  FlatParameters flat(params, nullptr, device_.act_dtype());
  forward(flat, t, with_targets, dloss_scale, s);
}

void Model::backward(ParameterStore& store, dev::Stream& s) {
  if (!grads_ready_) {
    throw std::logic_error(
        "Model::backward needs a preceding training forward (targets and a non-zero "
        "dloss_scale)");
  }
  grads_ready_ = false;
  const int t = t_;
  const GraphKey key{true, store.params(), store.replayable() ? store.grad(0) : nullptr,
                     t,    true,           0.0f};
  run_recorded(store, key, s, [&] { backward_pass(store, t, s); });
}

void Model::run_recorded(ParameterStore& store, const GraphKey& key, dev::Stream& s,
                         const std::function<void()>& work) {
  constexpr std::size_t kMaxRecordings = 4;
  if (!graphs_on_ || !store.replayable() || !device_.can_capture()) {
    work();
    return;
  }
  ++uses_;
  auto it = std::find_if(recordings_.begin(), recordings_.end(),
                         [&](const Recording& r) { return r.key == key; });
  if (it == recordings_.end()) {  // the first use runs eagerly, doing any lazy setup
    if (recordings_.size() == kMaxRecordings) {
      recordings_.erase(std::min_element(
          recordings_.begin(), recordings_.end(),
          [](const Recording& a, const Recording& b) { return a.last_use < b.last_use; }));
    }
    recordings_.push_back({key, uses_, nullptr});
    work();
    return;
  }
  it->last_use = uses_;
  if (it->graph != nullptr && it->graph->launch()) return;
  try {  // the second use, or the recording went stale
    it->graph = device_.capture(s, work);
  } catch (const std::exception& e) {
    graphs_on_ = false;
    graph_fallback_ = e.what();
    recordings_.clear();
    work();  // a real error surfaces again here
    return;
  }
  if (!it->graph->launch()) throw std::logic_error("a graph went stale while it was recorded");
}

void Model::backward(const void* params, void* grads, dev::Stream& s) {
  FlatParameters flat(params, grads, device_.act_dtype());
  backward(flat, s);
}

void Model::decode(ParameterStore& store, int pos, dev::Stream& s) {
  if (shape_.B != 1 || shape_.recompute) {
    throw std::logic_error("decode needs a model of micro-batch 1 without recompute (micro-batch " +
                           std::to_string(shape_.B) + (shape_.recompute ? ", recompute)" : ")"));
  }
  if (pos < 0 || pos >= shape_.T || pos > cached_) {
    throw std::invalid_argument("decode at position " + std::to_string(pos) +
                                ": need 0 <= pos < T = " + std::to_string(shape_.T) +
                                " and pos <= the " + std::to_string(cached_) +
                                " positions cached (forward over the prompt first)");
  }
  grads_ready_ = false;  // the step's logits row overwrites dlogits
  run(store, RowSpan::step(pos), s);
  cached_ = pos + 1;
}

void Model::decode(const void* params, int pos, dev::Stream& s) {
  FlatParameters flat(params, nullptr, device_.act_dtype());
  decode(flat, pos, s);
}

void check_shape(const ModelSpec& spec, const ModelShape& shape) {
  if (shape.B <= 0 || shape.T <= 0 || shape.T > spec.block_size) {
    throw std::invalid_argument(
        "micro-batch " + std::to_string(shape.B) + " x sequence length " + std::to_string(shape.T) +
        " is invalid: need B >= 1 and 1 <= T <= block_size = " + std::to_string(spec.block_size));
  }
}

std::unique_ptr<Model> make_model(dev::Device& device, const ParameterLayout& layout,
                                  const ModelShape& shape) {
  if (layout.spec().llama()) return std::make_unique<Llama>(device, layout, shape);
  return std::make_unique<Gpt>(device, layout, shape);
}

std::size_t activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                             std::size_t act_elem_bytes, int logits_stride) {
  const int Vp = logits_stride != 0 ? logits_stride : padded_vocab(spec.vocab_size);
  if (spec.llama()) return llama_activation_bytes(spec, shape, act_elem_bytes, Vp);
  return gpt_activation_bytes(spec, shape, act_elem_bytes, Vp);
}

}  // namespace zo::model
