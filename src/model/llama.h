// Llama-family forward and backward (Llama 3, Mistral, Qwen2), written against the device
// interface like Gpt (gpt.h, whose notes on the padded LM head apply here too). Per block:
//
//   h   = x + o_proj(attention(rope(qkv_proj(rmsnorm(x)))))      grouped-query, causal
//   out = h + down_proj(silu(gate_proj(rmsnorm(h))) * up_proj(rmsnorm(h)))
//
// then the final RMSNorm and the LM head (tied to embed_tokens or its own lm_head). q|k|v and
// gate|up are one GEMM each: their weights are adjacent in the layout (layout.h). RoPE's inverse
// frequencies (model/rope.h) live in a small device table made once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "device/device.h"
#include "model/activation_arena.h"
#include "model/device_batch.h"
#include "model/layout.h"
#include "model/model.h"

namespace zo::model {

std::size_t llama_activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                                   std::size_t act_elem_bytes, int logits_stride = 0);

class Llama final : public Model {
 public:
  Llama(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape);

  const ModelShape& shape() const override { return shape_; }
  const ParameterLayout& layout() const override { return layout_; }
  void set_batch(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                 dev::Stream& s) override {
    batch_->set(tokens, targets, s);
  }
  using Model::backward;
  using Model::forward;
  void forward(ParameterStore& store, int t, bool with_targets, float dloss_scale,
               dev::Stream& s) override;
  void backward(ParameterStore& store, dev::Stream& s) override;
  const float* losses() const override { return losses_; }
  const void* logits() const override { return logits_; }
  int logits_stride() const override { return Vp_; }

 private:
  struct LayerActs {
    void *ln1, *qkv, *atty, *res2, *ln2, *gate_up, *h;  // (B,T, C|QKV|Q|C|C|2I|I)
    float *rstd1, *rstd2, *lse;                         // (B,T), (B,T), (B,NH,T)
  };
  LayerActs& acts(int l) { return layers_[shape_.recompute ? 0 : static_cast<std::size_t>(l)]; }
  // Block l up to its MLP output in mlp_out_; recomputing (backward), up to the SwiGLU.
  void block_forward(const void* params, int l, int t, bool recomputing, dev::Stream& s);
  void* at(const void* base, std::size_t elements) const;  // base + elements in act dtype
  dev::AttentionArgs attention(int t) const;

  dev::Device& device_;
  const ParameterLayout& layout_;
  ModelShape shape_;
  std::size_t esize_;  // bytes per activation element
  int Vp_;             // row stride of the logits
  float eps_;          // rms_norm_eps
  std::unique_ptr<CarvedArena> arena_;
  std::unique_ptr<DeviceBatch> batch_;
  dev::Buffer inv_freq_;      // (head_dim / 2) fp32: RoPE's inverse frequencies
  int t_ = 0;                 // positions used by the last forward
  bool grads_ready_ = false;  // the last forward was a training forward

  std::vector<void*> residuals_;  // L+1 x (B,T,C): [0] embeddings, [l+1] block l out
  std::vector<LayerActs> layers_;  // L entries, or 1 with recompute
  void *attn_out_ = nullptr, *mlp_out_ = nullptr;  // (B,T,C) projections before the adds
  void* lnf_ = nullptr;                            // (B,T,C)
  float* lnf_rstd_ = nullptr;                      // (B,T)
  void* logits_ = nullptr;                         // (B,T) rows of Vp_
  float* losses_ = nullptr;                        // (B,T)
  // Backward scratch, reused by every block.
  void *dres_ = nullptr, *dh_ = nullptr, *dgate_up_ = nullptr, *dln_ = nullptr, *datty_ = nullptr,
       *dqkv_ = nullptr;
};

}  // namespace zo::model
