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
// gradients are written instead of accumulated into zero-filled buffers.
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

// Bytes of device memory Gpt allocates with the logits rows logits_stride elements apart
// (activation_bytes in model.h chooses the stride).
std::size_t gpt_activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                                 std::size_t act_elem_bytes, int logits_stride);

class Gpt final : public Model {
 public:
  Gpt(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape);

 protected:
  void embed_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) override;
  void block_forward(ParameterStore& store, int l, const RowSpan& r, bool recomputing,
                     dev::Stream& s) override;
  void final_norm_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) override;
  void final_norm_backward(ParameterStore& store, int t, dev::Stream& s) override;
  void block_backward(ParameterStore& store, int l, int t, dev::Stream& s) override;
  void embed_backward(ParameterStore& store, int t, dev::Stream& s) override;

 private:
  struct LayerActs {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;  // (B,T, C|3C|C|C|C|4C|4C)
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
  };
  LayerActs& acts(int l) { return layers_[shape_.recompute ? 0 : static_cast<std::size_t>(l)]; }

  std::vector<LayerActs> layers_;                // L entries, or 1 with recompute
  void *attproj_ = nullptr, *fcproj_ = nullptr;  // (B,T,C) scratch
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  // Backward scratch, reused by every block.
  void *dres_ = nullptr, *dfch_ = nullptr, *dln2_ = nullptr, *datty_ = nullptr, *dqkv_ = nullptr,
       *dln1_ = nullptr;
};

}  // namespace zo::model
