#include "model/layout.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/philox.h"

namespace zo::model {

ParameterLayout::ParameterLayout(const ModelSpec& spec) : spec_(spec) {
  spec_.validate();
  if (spec.llama()) {
    add_llama();
  } else {
    add_gpt2();
  }
  groups_.push_back({0, block_begin_.front()});
  for (int l = 0; l < spec.n_layer; ++l)
    groups_.push_back({block_begin(l), block_end(l)});
  groups_.push_back({block_begin_.back(), size_});
  if (size_ != spec.num_parameters()) {
    throw std::logic_error("ParameterLayout: size disagrees with ModelSpec::num_parameters");
  }
}

void ParameterLayout::add_gpt2() {
  const std::size_t C = spec_.n_embd, V = spec_.vocab_size, T = spec_.block_size;
  wte_ = lm_head_ = add("wte.weight", {V, C}, TensorKind::kEmbedding, -1);
  wpe_ = add("wpe.weight", {T, C}, TensorKind::kEmbedding, -1);
  for (int l = 0; l < spec_.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    block_begin_.push_back(size_);
    BlockParams b{};
    b.ln1_w = add(p + "ln_1.weight", {C}, TensorKind::kNormWeight, l);
    b.ln1_b = add(p + "ln_1.bias", {C}, TensorKind::kNormBias, l);
    b.qkv_w = add(p + "attn.c_attn.weight", {3 * C, C}, TensorKind::kMatrix, l, false, true);
    b.qkv_b = add(p + "attn.c_attn.bias", {3 * C}, TensorKind::kBias, l);
    b.attproj_w = add(p + "attn.c_proj.weight", {C, C}, TensorKind::kMatrix, l, true, true);
    b.attproj_b = add(p + "attn.c_proj.bias", {C}, TensorKind::kBias, l);
    b.ln2_w = add(p + "ln_2.weight", {C}, TensorKind::kNormWeight, l);
    b.ln2_b = add(p + "ln_2.bias", {C}, TensorKind::kNormBias, l);
    b.fc_w = add(p + "mlp.c_fc.weight", {4 * C, C}, TensorKind::kMatrix, l, false, true);
    b.fc_b = add(p + "mlp.c_fc.bias", {4 * C}, TensorKind::kBias, l);
    b.fcproj_w = add(p + "mlp.c_proj.weight", {C, 4 * C}, TensorKind::kMatrix, l, true, true);
    b.fcproj_b = add(p + "mlp.c_proj.bias", {C}, TensorKind::kBias, l);
    blocks_.push_back(b);
  }
  block_begin_.push_back(size_);
  lnf_w_ = add("ln_f.weight", {C}, TensorKind::kNormWeight, -1);
  lnf_b_ = add("ln_f.bias", {C}, TensorKind::kNormBias, -1);
}

// Hugging Face LlamaForCausalLM names; nn.Linear weights are (out, in) there as here.
void ParameterLayout::add_llama() {
  const ModelSpec& s = spec_;
  auto join_next = [&] { tensors_.back().joins_next = true; };
  const std::size_t C = s.n_embd, V = s.vocab_size, D = s.head_dim, I = s.intermediate_size;
  const std::size_t Q = std::size_t(s.n_head) * D, KV = std::size_t(s.n_kv_head) * D;
  wte_ = lm_head_ = add("model.embed_tokens.weight", {V, C}, TensorKind::kEmbedding, -1);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    block_begin_.push_back(size_);
    LlamaBlockParams b{};
    b.attn_norm = add(p + "input_layernorm.weight", {C}, TensorKind::kNormWeight, l);
    b.qkv_w = add(p + "self_attn.q_proj.weight", {Q, C}, TensorKind::kMatrix, l);
    join_next();
    add(p + "self_attn.k_proj.weight", {KV, C}, TensorKind::kMatrix, l);
    join_next();
    add(p + "self_attn.v_proj.weight", {KV, C}, TensorKind::kMatrix, l);
    if (s.qkv_bias) {
      b.qkv_b = add(p + "self_attn.q_proj.bias", {Q}, TensorKind::kBias, l);
      join_next();
      add(p + "self_attn.k_proj.bias", {KV}, TensorKind::kBias, l);
      join_next();
      add(p + "self_attn.v_proj.bias", {KV}, TensorKind::kBias, l);
    }
    b.o_w = add(p + "self_attn.o_proj.weight", {C, Q}, TensorKind::kMatrix, l);
    if (s.o_bias) b.o_b = add(p + "self_attn.o_proj.bias", {C}, TensorKind::kBias, l);
    b.mlp_norm = add(p + "post_attention_layernorm.weight", {C}, TensorKind::kNormWeight, l);
    b.gate_up_w = add(p + "mlp.gate_proj.weight", {I, C}, TensorKind::kMatrix, l);
    join_next();
    add(p + "mlp.up_proj.weight", {I, C}, TensorKind::kMatrix, l);
    b.down_w = add(p + "mlp.down_proj.weight", {C, I}, TensorKind::kMatrix, l);
    llama_blocks_.push_back(b);
  }
  block_begin_.push_back(size_);
  lnf_w_ = add("model.norm.weight", {C}, TensorKind::kNormWeight, -1);
  // An untied LM head is a Linear like any other (it decays as one).
  if (!s.tie_word_embeddings) lm_head_ = add("lm_head.weight", {V, C}, TensorKind::kMatrix, -1);
}

std::size_t ParameterLayout::add(const std::string& name, std::vector<std::size_t> shape,
                                 TensorKind kind, int layer, bool residual_projection,
                                 bool hf_transposed) {
  TensorInfo t;
  t.name = name;
  t.numel = 1;
  for (std::size_t d : shape)
    t.numel *= d;
  t.shape = std::move(shape);
  t.offset = size_;
  t.kind = kind;
  t.layer = layer;
  t.residual_projection = residual_projection;
  t.hf_transposed = hf_transposed;
  size_ += t.numel;
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

std::size_t ParameterLayout::group_of(std::size_t offset) const {
  if (offset >= size_) throw std::out_of_range("ParameterLayout::group_of: offset beyond layout");
  const auto it = std::upper_bound(groups_.begin(), groups_.end(), offset,
                                   [](std::size_t o, const Range& g) { return o < g.end; });
  return static_cast<std::size_t>(it - groups_.begin());
}

std::string ParameterLayout::group_name(std::size_t g) const {
  if (g == 0) return "embeddings";
  if (g + 1 == groups_.size()) return spec_.llama() ? "head" : "ln_f";
  return "block " + std::to_string(g - 1);
}

const TensorInfo& ParameterLayout::find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("no parameter named '" + name + "' in the layout of " + spec_.name);
}

const TensorInfo& ParameterLayout::tensor_at(std::size_t offset) const {
  if (offset >= size_) throw std::out_of_range("layout element beyond the layout");
  // Tensors lie in offset order: the last one starting at or before `offset`.
  const auto it = std::upper_bound(tensors_.begin(), tensors_.end(), offset,
                                   [](std::size_t o, const TensorInfo& t) { return o < t.offset; });
  return *(it - 1);
}

bool WeightDecayPolicy::applies_to(const TensorInfo& t) const {
  switch (t.kind) {
    case TensorKind::kMatrix:
      return matrices;
    case TensorKind::kEmbedding:
      return embeddings;
    default:
      return biases_and_norms;
  }
}

namespace {

// Element i of tensor `index` is normal number i of the Philox stream keyed by `seed` with the
// tensor index in the counter's third word; blocks of four elements run in parallel. Writes
// elements [first, first + n) of the tensor to p.
void fill_normal(float* p, std::size_t first, std::size_t n, std::uint64_t seed,
                 std::uint32_t index, double stddev) {
  if (n == 0) return;
  const std::size_t b0 = first / 4, b1 = (first + n - 1) / 4 + 1;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(b0, b1, 4096), [&](const auto& r) {
    for (std::size_t b = r.begin(); b != r.end(); ++b) {
      const auto z = philox_normals(
          philox4x32_10({std::uint32_t(b), std::uint32_t(std::uint64_t(b) >> 32), index, 0},
                        std::uint32_t(seed), std::uint32_t(seed >> 32)));
      for (std::size_t k = 0; k < 4; ++k) {
        const std::size_t i = 4 * b + k;
        if (i >= first && i < first + n) p[i - first] = static_cast<float>(stddev * z[k]);
      }
    }
  });
}

}  // namespace

void init_weights(const ParameterLayout& layout, std::uint64_t seed, float* params) {
  init_weights(layout, seed, 0, layout.size(), params);
}

void init_weights(const ParameterLayout& layout, std::uint64_t seed, std::size_t begin,
                  std::size_t end, float* out) {
  const ModelSpec& spec = layout.spec();
  const double stddev = spec.llama() ? spec.init_std : 0.02;
  const double residual_std = 0.02 / std::sqrt(2.0 * spec.n_layer);  // GPT-2 only
  std::uint32_t index = 0;
  for (const auto& t : layout.tensors()) {
    ++index;
    const std::size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    float* p = out + (lo - begin);
    const std::size_t n = hi - lo;
    switch (t.kind) {
      case TensorKind::kNormWeight:
        std::fill(p, p + n, 1.0f);
        break;
      case TensorKind::kNormBias:
      case TensorKind::kBias:
        std::fill(p, p + n, 0.0f);
        break;
      case TensorKind::kMatrix:
      case TensorKind::kEmbedding:
        fill_normal(p, lo - t.offset, n, seed, index,
                    t.residual_projection ? residual_std : stddev);
        break;
    }
  }
}

}  // namespace zo::model
