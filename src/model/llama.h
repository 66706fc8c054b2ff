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
#include "model/layout.h"
#include "model/model.h"
#include "model/row_span.h"

namespace zo::model {

// The same for Llama (gpt_activation_bytes).
std::size_t llama_activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                                   std::size_t act_elem_bytes, int logits_stride);

class Llama final : public Model {
 public:
  Llama(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape);

 protected:
  void embed_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) override;
  // Up to the block's output in residuals_[l + 1]; recomputing, up to the SwiGLU. A decode step
  // writes its qkv row into the cache and attends to the cached rows.
  void block_forward(ParameterStore& store, int l, const RowSpan& r, bool recomputing,
                     dev::Stream& s) override;
  void final_norm_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) override;
  void final_norm_backward(ParameterStore& store, int t, dev::Stream& s) override;
  void block_backward(ParameterStore& store, int l, int t, dev::Stream& s) override;
  void embed_backward(ParameterStore& store, int t, dev::Stream& s) override;

 private:
  struct LayerActs {
    void *ln1, *qkv, *atty, *res2, *ln2, *gate_up, *h;  // (B,T, C|QKV|Q|C|C|2I|I)
    float *rstd1, *rstd2, *lse;                         // (B,T), (B,T), (B,NH,T)
  };
  LayerActs& acts(int l) { return layers_[shape_.recompute ? 0 : static_cast<std::size_t>(l)]; }
  // Attention's shapes for B sequences of T rows whose first row is at position pos0.
  dev::AttentionArgs attention(int B, int T, int pos0 = 0) const;

  float eps_;             // rms_norm_eps
  dev::Buffer inv_freq_;  // (head_dim / 2) fp32: RoPE's inverse frequencies

  std::vector<LayerActs> layers_;                  // L entries, or 1 with recompute
  void *attn_out_ = nullptr, *mlp_out_ = nullptr;  // (B,T,C) projections before the adds
  float* lnf_rstd_ = nullptr;                      // (B,T)
  // Backward scratch, reused by every block.
  void *dres_ = nullptr, *dh_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr;
};

}  // namespace zo::model
