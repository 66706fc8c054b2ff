// The parameters of a GPT-2 model as one flat buffer in forward order, with named views that
// carry Hugging Face GPT-2 names. The same layout indexes the fp32 master copy on the host, the
// device copy, the gradients, and the Adam moments.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/spec.h"

namespace zo::model {

enum class TensorKind { kEmbedding, kLayerNormWeight, kLayerNormBias, kMatrix, kBias };

struct TensorInfo {
  std::string name;  // Hugging Face GPT-2 name without prefix, e.g. "h.3.mlp.c_fc.weight"
  std::vector<std::size_t> shape;  // ours, row-major; matrices are (out, in)
  std::size_t offset = 0;          // elements from the start of the flat buffer
  std::size_t numel = 0;
  TensorKind kind = TensorKind::kMatrix;
  int layer = -1;                    // transformer block, or -1 for embeddings / final LN
  bool residual_projection = false;  // attn.c_proj / mlp.c_proj: init scaled by 1/sqrt(2 L)
  // Hugging Face GPT-2 stores Linear weights as Conv1D (in, out): transpose on import/export.
  bool hf_transposed = false;
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

class ParameterLayout {
 public:
  explicit ParameterLayout(const ModelSpec& spec);

  const ModelSpec& spec() const { return spec_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::size_t size() const { return size_; }              // total parameters
  const TensorInfo& find(const std::string& name) const;  // throws std::out_of_range

  std::size_t wte() const { return wte_; }  // (V, C), also the tied LM head
  std::size_t wpe() const { return wpe_; }  // (block_size, C)
  const BlockParams& block(int l) const { return blocks_[static_cast<std::size_t>(l)]; }
  std::size_t lnf_w() const { return lnf_w_; }
  std::size_t lnf_b() const { return lnf_b_; }
  // [begin, end) of the elements that belong to block l.
  std::size_t block_begin(int l) const { return block_begin_[static_cast<std::size_t>(l)]; }
  std::size_t block_end(int l) const { return block_begin_[static_cast<std::size_t>(l) + 1]; }

  // The parameter groups in the order forward reads them: [0] the embeddings (wte, wpe),
  // [1 + l] block l, [n_layer + 1] the final LayerNorm. They tile the buffer. Forward announces
  // each group before reading it (ParameterStore::before_read); the offload engine uploads new
  // parameters group by group, and data parallelism cuts buckets at group boundaries.
  const std::vector<Range>& groups() const { return groups_; }
  std::size_t group_of(std::size_t offset) const;  // the group holding element `offset`
  std::string group_name(std::size_t g) const;     // "embeddings", "block 3", "ln_f"

 private:
  std::size_t add(const std::string& name, std::vector<std::size_t> shape, TensorKind kind,
                  int layer, bool residual_projection = false, bool hf_transposed = false);

  ModelSpec spec_;
  std::vector<TensorInfo> tensors_;
  std::size_t size_ = 0;
  std::size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<BlockParams> blocks_;
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

// GPT-2 initialisation (Radford et al. 2019): N(0, 0.02) for matrices and embeddings, residual
// projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1. Each tensor draws from
// its own counter-based stream (Philox keyed by the seed), filled in parallel: the result depends
// only on (spec, seed), not on the thread count or the build (host or CUDA).
void init_gpt2(const ParameterLayout& layout, std::uint64_t seed, float* params);

}  // namespace zo::model
