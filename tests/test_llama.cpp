// The Llama-family model on the host backend: per-position losses against an independent float64
// implementation written from the architecture's formulas (Hugging Face's LlamaForCausalLM:
// RMSNorm, rotate_half RoPE, grouped-query causal attention, SwiGLU), the whole gradient against
// central finite differences, recompute, and gradient buckets that keep fused tensors together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "device/device.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/spec.h"
#include "offload/bucket_plan.h"

namespace {

using nlohmann::json;
using zo::model::ModelSpec;
using zo::model::ParameterLayout;
using zo::model::TensorKind;

// Small enough for finite differences: 2 layers, C 16, 4 query heads over 2 kv heads, head_dim 6
// (not C / heads), I 12, V 13.
ModelSpec tiny_spec(const std::string& type, bool bias, bool tie, bool llama3) {
  json j = {{"model_type", type},       {"hidden_size", 16},        {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 6},
            {"intermediate_size", 12},  {"vocab_size", 13},         {"max_position_embeddings", 8},
            {"rms_norm_eps", 1e-5},     {"rope_theta", 100.0},      {"tie_word_embeddings", tie}};
  if (type == "llama") j["attention_bias"] = bias;
  if (llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 4.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 2.0},
                         {"original_max_position_embeddings", 4}};
  }
  return zo::model::model_spec_from_json(j, "tiny");
}

// Weights with non-trivial norms and biases: every parameter gets a gradient.
std::vector<float> random_weights(const ParameterLayout& layout, std::uint32_t seed) {
  std::vector<float> p(layout.size());
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (const auto& t : layout.tensors()) {
    const float sd = t.kind == TensorKind::kNormWeight ? 0.3f : 0.4f;
    const float mean = t.kind == TensorKind::kNormWeight ? 1.0f : 0.0f;
    for (std::size_t i = 0; i < t.numel; ++i)
      p[t.offset + i] = mean + sd * n(rng);
  }
  return p;
}

// ---- the float64 reference ---------------------------------------------------------------------
using Vec = std::vector<double>;

// x (rows, in) @ W^T with W (out, in) at w, plus bias b (out) when given.
Vec linear(const Vec& x, std::size_t rows, std::size_t in, const float* w, std::size_t out,
           const float* b) {
  Vec y(rows * out);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t o = 0; o < out; ++o) {
      double acc = b ? b[o] : 0.0;
      for (std::size_t i = 0; i < in; ++i)
        acc += x[r * in + i] * double(w[o * in + i]);
      y[r * out + o] = acc;
    }
  }
  return y;
}

Vec rmsnorm(const Vec& x, std::size_t rows, std::size_t C, const float* w, double eps) {
  Vec y(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::size_t c = 0; c < C; ++c)
      ss += x[r * C + c] * x[r * C + c];
    const double inv = 1.0 / std::sqrt(ss / double(C) + eps);
    for (std::size_t c = 0; c < C; ++c)
      y[r * C + c] = x[r * C + c] * inv * w[c];
  }
  return y;
}

// Per-position losses of one sequence (T tokens) of a Llama with weights p.
std::vector<double> reference_losses(const ModelSpec& s, const ParameterLayout& L,
                                     const std::vector<float>& p,
                                     const std::vector<std::int32_t>& tokens,
                                     const std::vector<std::int32_t>& targets) {
  const std::size_t T = tokens.size(), C = s.n_embd, H = s.n_head, KV = s.n_kv_head;
  const std::size_t D = s.head_dim, I = s.intermediate_size, V = s.vocab_size;
  auto at = [&](const std::string& name) { return p.data() + L.find(name).offset; };
  auto maybe = [&](const std::string& name) -> const float* {
    for (const auto& t : L.tensors())
      if (t.name == name) return p.data() + t.offset;
    return nullptr;
  };
  // RoPE frequencies: theta^(-2i/D), Llama 3 scaled through the table model/rope.h makes (its
  // own test checks it against the formula); without scaling computed here.
  std::vector<double> freq(D / 2);
  const std::vector<float> table = zo::model::rope_inv_freq({int(D), s.rope_theta, s.rope_scaling});
  for (std::size_t i = 0; i < D / 2; ++i) {
    freq[i] = s.rope_scaling.llama3 ? double(table[i])
                                    : std::pow(s.rope_theta, -2.0 * double(i) / double(D));
  }
  Vec x(T * C);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t c = 0; c < C; ++c)
      x[t * C + c] = at("model.embed_tokens.weight")[tokens[t] * C + c];
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const Vec h = rmsnorm(x, T, C, at(pre + "input_layernorm.weight"), s.norm_eps);
    Vec q = linear(h, T, C, at(pre + "self_attn.q_proj.weight"), H * D,
                   maybe(pre + "self_attn.q_proj.bias"));
    Vec k = linear(h, T, C, at(pre + "self_attn.k_proj.weight"), KV * D,
                   maybe(pre + "self_attn.k_proj.bias"));
    const Vec v = linear(h, T, C, at(pre + "self_attn.v_proj.weight"), KV * D,
                         maybe(pre + "self_attn.v_proj.bias"));
    // rotate_half: (x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin).
    auto rotate = [&](Vec& m, std::size_t heads) {
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t hh = 0; hh < heads; ++hh)
          for (std::size_t i = 0; i < D / 2; ++i) {
            double* r = &m[(t * heads + hh) * D];
            const double a = double(t) * freq[i], c = std::cos(a), sn = std::sin(a);
            const double x1 = r[i], x2 = r[i + D / 2];
            r[i] = x1 * c - x2 * sn;
            r[i + D / 2] = x2 * c + x1 * sn;
          }
    };
    rotate(q, H);
    rotate(k, KV);
    Vec att(T * H * D, 0.0);
    for (std::size_t hh = 0; hh < H; ++hh) {
      const std::size_t kh = hh / (H / KV);  // the kv head this query head reads
      for (std::size_t t = 0; t < T; ++t) {
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (std::size_t u = 0; u <= t; ++u) {
          double d = 0;
          for (std::size_t i = 0; i < D; ++i)
            d += q[(t * H + hh) * D + i] * k[(u * KV + kh) * D + i];
          sc[u] = d / std::sqrt(double(D));
          mx = std::max(mx, sc[u]);
        }
        double z = 0;
        for (double& e : sc)
          z += (e = std::exp(e - mx));
        for (std::size_t u = 0; u <= t; ++u)
          for (std::size_t i = 0; i < D; ++i)
            att[(t * H + hh) * D + i] += sc[u] / z * v[(u * KV + kh) * D + i];
      }
    }
    const Vec o = linear(att, T, H * D, at(pre + "self_attn.o_proj.weight"), C,
                         maybe(pre + "self_attn.o_proj.bias"));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] += o[i];
    const Vec h2 = rmsnorm(x, T, C, at(pre + "post_attention_layernorm.weight"), s.norm_eps);
    const Vec gate = linear(h2, T, C, at(pre + "mlp.gate_proj.weight"), I, nullptr);
    const Vec up = linear(h2, T, C, at(pre + "mlp.up_proj.weight"), I, nullptr);
    Vec act(T * I);
    for (std::size_t i = 0; i < act.size(); ++i)
      act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    const Vec down = linear(act, T, I, at(pre + "mlp.down_proj.weight"), C, nullptr);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] += down[i];
  }
  const Vec f = rmsnorm(x, T, C, at("model.norm.weight"), s.norm_eps);
  const float* head =
      s.tie_word_embeddings ? at("model.embed_tokens.weight") : at("lm_head.weight");
  const Vec logits = linear(f, T, C, head, V, nullptr);
  std::vector<double> losses(T);
  for (std::size_t t = 0; t < T; ++t) {
    double mx = -1e300, z = 0;
    for (std::size_t c = 0; c < V; ++c)
      mx = std::max(mx, logits[t * V + c]);
    for (std::size_t c = 0; c < V; ++c)
      z += std::exp(logits[t * V + c] - mx);
    losses[t] = std::log(z) + mx - logits[t * V + std::size_t(targets[t])];
  }
  return losses;
}

// ---- the model on the host backend -------------------------------------------------------------
struct Rig {
  ModelSpec spec;
  ParameterLayout layout;
  std::unique_ptr<zo::dev::Device> dev = zo::dev::make_host_device({});
  std::unique_ptr<zo::dev::Stream> stream = dev->create_stream();
  zo::dev::Buffer params, grads;
  std::vector<std::int32_t> tokens, targets;
  int B, T;

  Rig(const ModelSpec& s, int b, int t, std::uint32_t seed) : spec(s), layout(s), B(b), T(t) {
    params = dev->alloc(layout.size() * 4, "params");
    grads = dev->alloc(layout.size() * 4, "grads");
    set(random_weights(layout, seed));
    std::mt19937 rng(seed + 1);
    std::uniform_int_distribution<int> tok(0, s.vocab_size - 1);
    for (int i = 0; i < B * T; ++i) {
      tokens.push_back(tok(rng));
      targets.push_back(tok(rng));
    }
  }
  void set(const std::vector<float>& host) {
    dev->copy_to_device(params.data(), host.data(), host.size() * 4, *stream);
    stream->synchronize();
  }
  std::vector<float> read(const zo::dev::Buffer& b) {
    std::vector<float> out(layout.size());
    dev->copy_to_host(out.data(), b.data(), out.size() * 4, *stream);
    stream->synchronize();
    return out;
  }
  // Per-position losses; with grads, d(mean loss)/dparams accumulated into `grads`.
  std::vector<float> losses(zo::model::Model& m, bool with_grads) {
    m.set_batch(tokens, targets, *stream);
    m.forward(params.data(), T, true, with_grads ? 1.0f / float(B * T) : 0.0f, *stream);
    if (with_grads) m.backward(params.data(), grads.data(), *stream);
    std::vector<float> l(std::size_t(B) * T);
    dev->copy_to_host(l.data(), m.losses(), l.size() * 4, *stream);
    stream->synchronize();
    return l;
  }
  double mean_loss(zo::model::Model& m) {
    const auto l = losses(m, false);
    return std::accumulate(l.begin(), l.end(), 0.0) / double(l.size());
  }
};

struct Variant {
  const char* name;
  const char* type;
  bool bias, tie, llama3;
};
const Variant kVariants[] = {{"llama", "llama", false, false, false},
                             {"llama_biases_tied_llama3", "llama", true, true, true},
                             {"qwen2", "qwen2", false, true, false},
                             {"mistral", "mistral", false, false, true}};

class LlamaModel : public ::testing::TestWithParam<Variant> {
 protected:
  ModelSpec spec() const {
    const Variant& v = GetParam();
    return tiny_spec(v.type, v.bias, v.tie, v.llama3);
  }
};

TEST_P(LlamaModel, LossesMatchAFloat64Reference) {
  Rig r(spec(), 2, 7, 11);
  const auto m = zo::model::make_model(*r.dev, r.layout, {r.B, r.T, false});
  const std::vector<float> got = r.losses(*m, false);
  const std::vector<float> p = r.read(r.params);
  for (int b = 0; b < r.B; ++b) {
    const auto first = r.tokens.begin() + b * r.T, tfirst = r.targets.begin() + b * r.T;
    const std::vector<double> want =
        reference_losses(r.spec, r.layout, p, {first, first + r.T}, {tfirst, tfirst + r.T});
    for (int t = 0; t < r.T; ++t)
      EXPECT_NEAR(got[std::size_t(b * r.T + t)], want[std::size_t(t)], 1e-5 * want[std::size_t(t)])
          << "sequence " << b << " position " << t;
  }
}

TEST_P(LlamaModel, GradientMatchesFiniteDifferences) {
  Rig r(spec(), 2, 5, 3);
  const auto m = zo::model::make_model(*r.dev, r.layout, {r.B, r.T, false});
  r.dev->fill_zero(r.grads.data(), r.grads.bytes(), *r.stream);
  r.losses(*m, true);
  const std::vector<float> grad = r.read(r.grads);
  std::vector<float> p = r.read(r.params);
  std::mt19937 rng(17);
  for (const auto& t : r.layout.tensors()) {
    std::uniform_int_distribution<std::size_t> pick(0, t.numel - 1);
    for (int k = 0; k < 3; ++k) {
      const std::size_t i = t.offset + pick(rng);
      const float orig = p[i], h = 1e-2f * std::max(1.0f, std::fabs(orig));
      p[i] = orig + h;
      r.set(p);
      const double up = r.mean_loss(*m);
      p[i] = orig - h;
      r.set(p);
      const double down = r.mean_loss(*m);
      p[i] = orig;
      const double fd = (up - down) / (2.0 * double(h));
      EXPECT_NEAR(grad[i], fd, 2e-3 + 2e-2 * std::fabs(fd))
          << t.name << " element " << i - t.offset;
    }
  }
  r.set(p);
}

TEST_P(LlamaModel, RecomputeGivesIdenticalGradients) {
  Rig r(spec(), 2, 5, 5);
  const auto plain = zo::model::make_model(*r.dev, r.layout, {r.B, r.T, false});
  const auto recompute = zo::model::make_model(*r.dev, r.layout, {r.B, r.T, true});
  r.dev->fill_zero(r.grads.data(), r.grads.bytes(), *r.stream);
  const auto l1 = r.losses(*plain, true);
  const auto g1 = r.read(r.grads);
  r.dev->fill_zero(r.grads.data(), r.grads.bytes(), *r.stream);
  const auto l2 = r.losses(*recompute, true);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, r.read(r.grads));
  EXPECT_GT(zo::model::activation_bytes(r.spec, {2, 5, false}, 4),
            zo::model::activation_bytes(r.spec, {2, 5, true}, 4));
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaModel, ::testing::ValuesIn(kVariants),
                         [](const auto& test) { return std::string(test.param.name); });

// One GEMM writes q|k|v (and gate|up): a bucket boundary inside would hand it two buckets.
TEST(LlamaBuckets, FusedTensorsStayInOneBucket) {
  const ParameterLayout layout(tiny_spec("llama", true, false, false));
  for (std::size_t target : {std::size_t{2}, std::size_t{64}, std::size_t{1000}}) {
    zo::offload::BucketPlanOptions o;
    o.target_bytes = target;
    o.grad_elem_bytes = 2;
    const zo::offload::BucketPlan plan(layout, o);
    std::size_t covered = 0;
    for (const auto& b : plan.buckets()) {
      EXPECT_EQ(b.begin, covered);
      covered = b.end;
      const auto& first = layout.tensors()[b.first_tensor];
      for (const char* joined : {"k_proj", "v_proj", "up_proj"})
        EXPECT_EQ(first.name.find(joined), std::string::npos) << first.name << " starts a bucket";
    }
    EXPECT_EQ(covered, layout.size());
  }
}

}  // namespace
