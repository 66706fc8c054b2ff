// GPT-2 forward and backward, written once against the device interface (device/device.h). The
// model owns its activations and token buffers on the device; parameters and gradients belong to
// a ParameterStore (flat buffers, or the offload engine's uploads and gradient buckets).
//
// The LM head's padding. GPT-2's vocabulary, V = 50257, is odd: as a leading dimension of the
// three LM-head GEMMs (logits, their input gradient, wte's gradient) it leaves rows 2-byte
// aligned, which rules out cuBLASLt's TMA / tensor-core kernels (docs/performance.md). llm.c pads
// wte itself to Vp rows; here the flat parameter layout is shared with the host optimizer,
// checkpoints, exports and the Hugging Face import, and must keep V rows. So only the logits
// buffer is padded: its rows are Vp = device.gemm_row_stride(V) elements apart (50304 on CUDA; V
// on the host backend, whose results and packed logits stay as they were). The GEMMs see
// 16-byte-aligned leading dimensions while their M/N/K stay V; the columns [V, Vp) are never
// written, never read as classes by cross_entropy, and never read by the backward GEMMs (their K
// or N is V), so nothing there reaches a loss or a gradient.
//
// Fusions (device.h): each residual add runs with the LayerNorm that reads its output
// (residual_layernorm_forward; the add ending block l carries block l + 1's first LayerNorm, or
// the final one); the MLP's first layer runs with its GELU (matmul_gelu_forward) and its
// projection's input gradient with the GELU gradient (matmul_dgelu_backward). Activation
// gradients are written instead of accumulated into zero-filled buffers, except dqkv, which
// attention_backward accumulates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "device/device.h"
#include "model/layout.h"

namespace zo::model {

// The one interface between the model and whoever provides its parameters and takes its
// gradients (docs/architecture.md, "One gradient bucket").
// - params(): the (layout.size()) parameters in act dtype on the device.
// - before_read(g): forward calls it before enqueueing the first op that reads parameter group g
//   (ParameterLayout::groups()), in order 0, 1, ..., n_layer + 1: the offload engine makes the
//   stream wait there for that group's upload only.
// - grad(offset): where backward accumulates (+=) the gradient of the tensor starting at layout
//   element `offset` (the whole tensor, act dtype). Tensors are written in descending layout
//   order, except wte, which the LM head writes first and the embedding backward writes again
//   last.
// - complete_from(x): after every op that writes parameter gradients, backward says that every
//   tensor at offset >= x other than wte is final for this backward; complete_from(0) comes last.
//   The offload engine streams buckets to the host from these calls (docs/offload.md).
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  virtual const void* params() = 0;
  virtual void before_read(std::size_t group) { (void)group; }
  virtual void* grad(std::size_t offset) = 0;
  virtual void complete_from(std::size_t offset) { (void)offset; }
};

// Flat buffers in layout order: parameters and (for backward) gradients, act dtype, device.
class FlatParameters final : public ParameterStore {
 public:
  FlatParameters(const void* params, void* grads, DType act) noexcept
      : params_(params), grads_(static_cast<char*>(grads)), esize_(dtype_size(act)) {}
  const void* params() override { return params_; }
  void* grad(std::size_t offset) override;

 private:
  const void* params_;
  char* grads_;
  std::size_t esize_;
};

struct GptShape {
  int B = 1;               // micro-batch
  int T = 1;               // sequence length (<= block_size)
  bool recompute = false;  // keep only each block's input; recompute the block in backward
};

// Throws std::invalid_argument for a spec this class does not run (the Llama family).
void require_gpt2(const ModelSpec& spec);

// Bytes of device memory Gpt allocates for activations, scratch and token buffers, with the
// logits rows logits_stride elements apart; 0: the CUDA backend's padded stride, which bounds
// every device's.
std::size_t gpt_activation_bytes(const ModelSpec& spec, const GptShape& shape,
                                 std::size_t act_elem_bytes, int logits_stride = 0);

class Gpt {
 public:
  Gpt(dev::Device& device, const ParameterLayout& layout, const GptShape& shape);

  const GptShape& shape() const { return shape_; }
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

 private:
  struct LayerActs {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;  // (B,T, C|3C|C|C|C|4C|4C)
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
  };
  LayerActs& acts(int l) { return layers_[shape_.recompute ? 0 : static_cast<std::size_t>(l)]; }
  void block_forward(const void* params, int l, int t, bool recomputing, dev::Stream& s);
  void* at(const void* base, std::size_t elements) const;  // base + elements in act dtype

  dev::Device& device_;
  const ParameterLayout& layout_;
  GptShape shape_;
  std::size_t esize_;  // bytes per activation element
  int Vp_;             // row stride of the logits
  dev::Buffer arena_;
  std::size_t arena_used_ = 0;
  int t_ = 0;                 // positions used by the last forward
  bool grads_ready_ = false;  // the last forward was a training forward

  std::int32_t *tokens_ = nullptr, *targets_ = nullptr;  // (B,T) device
  std::vector<std::int32_t> staged_tokens_[2], staged_targets_[2];
  std::unique_ptr<dev::Event> staged_done_[2];
  int stage_ = 0;

  std::vector<void*> residuals_;                 // L+1 x (B,T,C): [0] embeddings, [l+1] block l out
  std::vector<LayerActs> layers_;                // L entries, or 1 with recompute
  void *attproj_ = nullptr, *fcproj_ = nullptr;  // (B,T,C) scratch
  void* lnf_ = nullptr;                          // (B,T,C)
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  void* logits_ = nullptr;   // (B,T) rows of Vp_
  float* losses_ = nullptr;  // (B,T)
  // Backward scratch, reused by every block.
  void *dres_ = nullptr, *dfch_ = nullptr, *dln2_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr,
       *dln1_ = nullptr;
};

}  // namespace zo::model
