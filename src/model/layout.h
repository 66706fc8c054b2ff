// The parameters of a model as one flat buffer in forward order, with named views that carry
// Hugging Face names (GPT-2's, or Llama's "model.layers.N...."). The same layout indexes the fp32
// master copy on the host, the device copy, the gradients, and the Adam moments.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/spec.h"

namespace zo::model {

// kNormWeight / kNormBias: LayerNorm's (GPT-2) or RMSNorm's weight (Llama).
enum class TensorKind { kEmbedding, kNormWeight, kNormBias, kMatrix, kBias };

struct TensorInfo {
  // Hugging Face name: GPT-2's without prefix ("h.3.mlp.c_fc.weight"), Llama's in full
  // ("model.layers.3.mlp.up_proj.weight").
  std::string name;
  std::vector<std::size_t> shape;  // ours, row-major; matrices are (out, in)
  std::size_t offset = 0;          // elements from the start of the flat buffer
  std::size_t numel = 0;
  TensorKind kind = TensorKind::kMatrix;
  int layer = -1;                    // transformer block, or -1 for embeddings / final LN
  bool residual_projection = false;  // attn.c_proj / mlp.c_proj: init scaled by 1/sqrt(2 L)
  // Hugging Face GPT-2 stores Linear weights as Conv1D (in, out): transpose on import/export.
  bool hf_transposed = false;
  // One GEMM writes this tensor's gradient together with the next one's (Llama's fused q|k|v and
  // gate|up): whoever cuts the layout into pieces (gradient buckets) keeps them together.
  bool joins_next = false;
};

// A contiguous range of the flat buffer, in elements.
struct Range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

// Offsets of one block's tensors (elements into the flat buffer).
struct BlockParams {
  std::size_t ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w,
      fcproj_b;
};

// One Llama block. q|k|v weights are adjacent, so they are one fused ((Hq + 2 Hkv) D, C) matrix,
// as are their biases and gate|up ((2 I, C)). kNone where the model has no such bias.
struct LlamaBlockParams {
  static constexpr std::size_t kNone = ~std::size_t{0};
  std::size_t attn_norm, qkv_w, qkv_b = kNone, o_w, o_b = kNone, mlp_norm, gate_up_w, down_w;
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const ModelSpec& spec);

  const ModelSpec& spec() const { return spec_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::size_t size() const { return size_; }              // total parameters
  const TensorInfo& find(const std::string& name) const;  // throws std::out_of_range
  // The tensor holding layout element `offset` (< size()).
  const TensorInfo& tensor_at(std::size_t offset) const;

  std::size_t wte() const { return wte_; }          // (V, C): wte / embed_tokens, the tied LM head
  std::size_t lm_head() const { return lm_head_; }  // (V, C): wte() when tied
  std::size_t wpe() const { return wpe_; }          // (block_size, C); GPT-2 only
  const BlockParams& block(int l) const { return blocks_.at(static_cast<std::size_t>(l)); }
  const LlamaBlockParams& llama_block(int l) const {
    return llama_blocks_.at(static_cast<std::size_t>(l));
  }
  std::size_t lnf_w() const { return lnf_w_; }  // final LayerNorm / RMSNorm (model.norm) weight
  std::size_t lnf_b() const { return lnf_b_; }  // GPT-2 only
  // [begin, end) of the elements that belong to block l.
  std::size_t block_begin(int l) const { return block_begin_[static_cast<std::size_t>(l)]; }
  std::size_t block_end(int l) const { return block_begin_[static_cast<std::size_t>(l) + 1]; }

  // The parameter groups in the order forward reads them: [0] the embeddings (wte, wpe), [1 + l]
  // block l, [n_layer + 1] the final norm (with an untied LM head). They tile the buffer. Forward
  // and backward announce each group before reading it (ParameterStore::before_read); the
  // offload engine uploads new parameters group by group, and data parallelism cuts buckets at
  // group boundaries.
  const std::vector<Range>& groups() const { return groups_; }
  std::size_t group_of(std::size_t offset) const;  // the group holding element `offset`
  std::string group_name(std::size_t g) const;     // "embeddings", "block 3", "ln_f" / "head"

 private:
  std::size_t add(const std::string& name, std::vector<std::size_t> shape, TensorKind kind,
                  int layer, bool residual_projection = false, bool hf_transposed = false);
  void add_gpt2();
  void add_llama();

  ModelSpec spec_;
  std::vector<TensorInfo> tensors_;
  std::size_t size_ = 0;
  std::size_t wte_ = 0, lm_head_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<BlockParams> blocks_;             // GPT-2
  std::vector<LlamaBlockParams> llama_blocks_;  // Llama
  std::vector<std::size_t> block_begin_;
  std::vector<Range> groups_;
};

// By default weight decay applies to matrices only (not biases, LayerNorm or embeddings).
struct WeightDecayPolicy {
  bool matrices = true;
  bool embeddings = false;
  bool biases_and_norms = false;
  bool applies_to(const TensorInfo& t) const;
};

// Initial weights. GPT-2 (Radford et al. 2019): N(0, 0.02) for matrices and embeddings, residual
// projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1. Llama (transformers'
// LlamaPreTrainedModel): N(0, initializer_range) for matrices and embeddings, biases 0, RMSNorm
// weight 1. Each tensor draws from its own counter-based stream (Philox keyed by the seed),
// filled in parallel: the result depends only on (spec, seed), not on the thread count or the
// build (host or CUDA).
void init_weights(const ParameterLayout& layout, std::uint64_t seed, float* params);
// Layout elements [begin, end) of the same weights, into out[0, end - begin): a rank initialises
// what it owns without the whole model.
void init_weights(const ParameterLayout& layout, std::uint64_t seed, std::size_t begin,
                  std::size_t end, float* out);

}  // namespace zo::model
