// A language model's forward and backward over the device interface: GPT-2 (gpt.h) or the Llama
// family (llama.h), chosen by the spec. The trainer, evaluation and sampling see only this.
// A model owns its activations and token buffers on the device; parameters and gradients belong
// to a ParameterStore (flat buffers, or the offload engine's uploads and gradient buckets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "model/activation_arena.h"
#include "model/device_batch.h"
#include "model/layout.h"
#include "model/parameter_store.h"
#include "model/row_span.h"

namespace zo::model {

struct ModelShape {
  int B = 1;               // micro-batch
  int T = 1;               // sequence length (<= block_size)
  bool recompute = false;  // keep only each block's input; recompute the block in backward
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelShape& shape() const { return shape_; }
  const ParameterLayout& layout() const { return layout_; }

  // Copies a batch (B*T tokens and targets; targets may be empty for inference) to the device
  // on stream s. The host vectors may be reused as soon as this returns.
  void set_batch(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                 dev::Stream& s);

  // Forward over the first t <= T positions of the batch. With targets, per-position losses are
  // computed; with dloss_scale != 0 the logits buffer is overwritten with dloss_scale * dL/dlogits
  // for the backward pass that must follow.
  void forward(ParameterStore& store, int t, bool with_targets, float dloss_scale, dev::Stream& s);
  void forward(const void* params, int t, bool with_targets, float dloss_scale, dev::Stream& s);

  // Accumulates (+=) the gradients of the last training forward into the store.
  void backward(ParameterStore& store, dev::Stream& s);
  // The same into one flat buffer (layout.size(), act dtype).
  void backward(const void* params, void* grads, dev::Stream& s);

  // Device pointers for the last forward: losses (B*T fp32), logits (B*T rows of V act dtype,
  // logits_stride() elements apart; hold dlogits after a training forward).
  const float* losses() const { return losses_; }
  const void* logits() const { return logits_; }
  // The logits' row stride: V on the host backend, V rounded up to a multiple of 128 on CUDA.
  int logits_stride() const { return Vp_; }

  // Incremental decoding with a KV cache (micro-batch 1, recompute off). The cache is each
  // layer's qkv activations, (T, qkv_width) with the row of position p as [q | k | v] (the
  // layout of dev::AttentionArgs): no memory beyond the activations. A forward over the first t
  // positions (the prompt) fills rows [0, t). decode(pos) runs the token of position pos
  // (set_token) through every block as one row: it writes that position's qkv row (k and v
  // rotated by RoPE at pos in the Llama family), attends to rows [0, pos] and writes logits row
  // pos, equal to what a forward over pos + 1 positions would write. Needs pos < T and pos <=
  // the positions cached so far (a forward over t caches t; decode(pos) leaves pos + 1).
  void decode(ParameterStore& store, int pos, dev::Stream& s);
  void decode(const void* params, int pos, dev::Stream& s);
  // The token of position pos (sequence 0), for decode; the host value may be reused at once.
  void set_token(int pos, std::int32_t token, dev::Stream& s);

  // CUDA Graphs (docs/gpu.md). When on, on a device that can record graphs and with a replayable
  // store (ParameterStore::replayable), a forward or backward runs eagerly the first time it has
  // its positions, targets, loss scale and parameter buffers, is recorded the second time and
  // replayed as one launch from then on (a few recordings are kept, the least recently used
  // dropped). Decode steps always run eagerly. If a recording fails, the model runs eagerly from
  // then on and graph_fallback() says why.
  void use_graphs(bool on) { graphs_on_ = on; }
  const std::string& graph_fallback() const { return graph_fallback_; }

 protected:
  // Checks the shape; the subclass then carves its activations (carve) and its own buffers.
  Model(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape);

  // One pass, parameter group by group (ParameterLayout::groups()): run() and backward_pass()
  // announce each group to the store (ParameterStore::before_read) and call the hook that reads
  // it; a hook reads parameters through store.param() and only those of its own group. The LM
  // head (logits_ from lnf_, and its backward into dlnf_) is the same for every model and is
  // run here.
  //
  // Group 0: the embedding of r's tokens into residuals_[0].
  virtual void embed_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) = 0;
  // Group l + 1: block l over the rows of r, from residuals_[l]. Recomputing (in backward, with
  // recompute on), only what block_backward reads.
  virtual void block_forward(ParameterStore& store, int l, const RowSpan& r, bool recomputing,
                             dev::Stream& s) = 0;
  // Group n_layer + 1: the end of the last block and the final norm into lnf_.
  virtual void final_norm_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) = 0;
  // The backward of a training forward over t positions: the final norm's from dlnf_ (its
  // gradients are final after it), block l's, then the embedding's (which reads no parameter).
  virtual void final_norm_backward(ParameterStore& store, int t, dev::Stream& s) = 0;
  virtual void block_backward(ParameterStore& store, int l, int t, dev::Stream& s) = 0;
  virtual void embed_backward(ParameterStore& store, int t, dev::Stream& s) = 0;

  // Allocates the activations the walk describes (activation_arena.h), whose first buffers must
  // be the (B*T) int32 tokens and targets, handed to batch_, and the n_layer + 1 points of the
  // residual stream. The subclass takes the rest from arena() in walk order.
  template <class Walk>
  void carve(Walk&& walk) {
    arena_ = std::make_unique<CarvedArena>(device_, walk);
    std::int32_t* tokens = arena_->next_i32();
    std::int32_t* targets = arena_->next_i32();
    batch_ = std::make_unique<DeviceBatch>(
        device_, tokens, targets, std::size_t(shape_.B) * shape_.T, layout_.spec().vocab_size);
    for (int i = 0; i <= layout_.spec().n_layer; ++i)
      residuals_.push_back(arena_->next());
  }
  CarvedArena& arena() { return *arena_; }
  const std::int32_t* tokens() const { return batch_->tokens(); }
  void* at(const void* base, std::size_t elements) const;  // base + elements in act dtype

  dev::Device& device_;
  const ParameterLayout& layout_;
  const ModelShape shape_;
  const std::size_t esize_;       // bytes per activation element, of parameters and gradients too
  const int Vp_;                  // the logits' row stride (gemm_row_stride(V))
  std::vector<void*> residuals_;  // L+1 x (B,T,C): [0] embeddings, [l+1] block l out
  void* lnf_ = nullptr;           // (B,T,C) the final norm's output, the LM head's input
  void* dlnf_ = nullptr;          // (B,T,C) its gradient (backward scratch)
  void* logits_ = nullptr;        // (B,T) rows of Vp_; dlogits after a training forward
  float* losses_ = nullptr;       // (B,T)

 private:
  // Embedding, blocks and LM head (logits_) over the rows of r: a forward's whole batch, or
  // decode's step.
  void run(ParameterStore& store, const RowSpan& r, dev::Stream& s);
  // The backward of a training forward over t positions, from dlogits (in logits_) down.
  void backward_pass(ParameterStore& store, int t, dev::Stream& s);

  std::unique_ptr<CarvedArena> arena_;
  std::unique_ptr<DeviceBatch> batch_;
  int t_ = 0;                 // positions used by the last forward
  bool grads_ready_ = false;  // the last forward was a training forward
  int cached_ = 0;  // positions [0, cached_) of the KV cache hold the current sequence's rows

  // What a recording depends on besides the shape.
  struct GraphKey {
    bool backward;
    const void* params;
    const void* grads;  // nullptr for a forward
    int t;
    bool with_targets;
    float dloss_scale;
    bool operator==(const GraphKey&) const = default;
  };
  struct Recording {
    GraphKey key;
    std::uint64_t last_use;
    std::unique_ptr<dev::Graph> graph;  // null until the second use
  };
  // Runs work (which enqueues on s) eagerly, or records it and replays the recording.
  void run_recorded(ParameterStore& store, const GraphKey& key, dev::Stream& s,
                    const std::function<void()>& work);
  bool graphs_on_ = false;
  std::string graph_fallback_;
  std::vector<Recording> recordings_;
  std::uint64_t uses_ = 0;
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
// V rounded up to the CUDA backend's GEMM row alignment: the logits stride that bounds every
// device's (Device::gemm_row_stride).
inline int padded_vocab(int V) {
  return (V + dev::kGemmRowAlign - 1) / dev::kGemmRowAlign * dev::kGemmRowAlign;
}

}  // namespace zo::model
