// Model spec, parameter layout, initialisation, and the whole GPT's gradient against finite
// differences on the host backend.
#include <gtest/gtest.h>

#include <tbb/global_control.h>
#include <chrono>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "device/device.h"
#include "model/gpt.h"
#include "model/layout.h"
#include "model/philox.h"
#include "model/spec.h"

namespace {

using zo::model::Gpt;
using zo::model::ModelShape;
using zo::model::ModelSpec;
using zo::model::ParameterLayout;

template <class Fn>
void expect_invalid(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ModelSpec, PresetsMatchPublishedParameterCounts) {
  // Hugging Face GPT-2 parameter counts (tied LM head).
  EXPECT_EQ(zo::model::load_model_spec("gpt2-124m").num_parameters(), 124439808u);
  EXPECT_EQ(zo::model::load_model_spec("gpt2-350m").num_parameters(), 354823168u);
  EXPECT_EQ(zo::model::load_model_spec("gpt2-774m").num_parameters(), 774030080u);
  EXPECT_EQ(zo::model::load_model_spec("gpt2-1558m").num_parameters(), 1557611200u);
}

TEST(ModelSpec, JsonWithGpt2KeysAndErrors) {
  const auto s = zo::model::model_spec_from_json(
      {{"n_layer", 3}, {"n_head", 4}, {"n_embd", 32}, {"vocab_size", 99}, {"n_positions", 17}},
      "test");
  EXPECT_EQ(s.block_size, 17);
  EXPECT_EQ(s.n_layer, 3);
  const nlohmann::json ok = {
      {"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"vocab_size", 5}, {"block_size", 4}};
  auto with = [&](const char* k, nlohmann::json v) {
    nlohmann::json j = ok;
    j[k] = v;
    return [j] { zo::model::model_spec_from_json(j, "t"); };
  };
  expect_invalid(with("n_head", 3), "not divisible");
  // The real bound (kMaxLayers), not the 2^30 that every integer key is first read within.
  expect_invalid(with("n_layer", 0), "n_layer = 0 is out of range (1 .. 4096)");
  expect_invalid(with("block_size", -1), "block_size = -1 is out of range (1 .. 1048576)");
  expect_invalid(with("n_layer", nlohmann::json(std::uint64_t{1} << 63)),
                 "n_layer = 9223372036854775808 is above the supported 4096");
  expect_invalid(with("n_embd", -8), "n_embd");
  expect_invalid(with("vocab_size", "50257"), "must be an integer");
  expect_invalid(with("n_embed", 8), "unknown key(s): n_embed");
  expect_invalid(with("n_positions", 5), "disagree");
  nlohmann::json missing = ok;
  missing.erase("vocab_size");
  expect_invalid([&] { zo::model::model_spec_from_json(missing, "t"); },
                 "missing key 'vocab_size'");
  expect_invalid([] { zo::model::load_model_spec("gpt2-9000m"); }, "presets: tiny");
}

// Specs far beyond any machine are refused by the spec's own arithmetic, at once, before a layout
// of millions of tensors or a plan is built; no parameter count wraps around size_t.
TEST(ModelSpec, HugeSpecsAreRefusedBeforeAnyWork) {
  const nlohmann::json ok = {
      {"n_layer", 1}, {"n_head", 2}, {"n_embd", 8}, {"vocab_size", 5}, {"block_size", 4}};
  auto with = [&](nlohmann::json changes) {
    nlohmann::json j = ok;
    j.update(changes);
    return [j] { zo::model::model_spec_from_json(j, "t"); };
  };
  const auto t0 = std::chrono::steady_clock::now();
  expect_invalid(with({{"n_layer", 1000000}}), "n_layer = 1000000 is above the supported 4096");
  expect_invalid(with({{"vocab_size", 1 << 30}}), "vocab_size");
  expect_invalid(with({{"n_embd", 1 << 20}, {"n_head", 1}}), "n_embd");
  expect_invalid(with({{"block_size", 1 << 30}}), "block_size");
  // Every dimension within its bound, the product not: 4096 layers of width 65536 is 2.1e14.
  expect_invalid(with({{"n_layer", 4096}, {"n_embd", 65536}, {"n_head", 1}}),
                 "the model has 2.11e+14 parameters, above the supported 4.4e+12");
  // A hang guard, not a speed check: building any of these would take minutes.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  // The largest preset is well inside the bounds.
  EXPECT_LT(zo::model::load_model_spec("gpt-13b").num_parameters(), zo::model::kMaxParameters);
}

TEST(ModelSpec, LoadsFileAndRejectsBadJson) {
  const auto dir = std::filesystem::temp_directory_path() / ("zo_spec_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "ok.json") << R"({"n_layer": 2, "n_head": 2, "n_embd": 16,
                                          "vocab_size": 300, "block_size": 32})";
    std::ofstream(dir / "bad.json") << R"({"n_layer": 2,,})";
  }
  EXPECT_EQ(zo::model::load_model_spec((dir / "ok.json").string()).vocab_size, 300);
  // Without a "name" the spec is named by its path, which messages quote once.
  EXPECT_EQ(zo::model::load_model_spec((dir / "ok.json").string()).name,
            (dir / "ok.json").string());
  {
    std::ofstream(dir / "odd.json") << R"({"n_layer": 2, "n_head": 3, "n_embd": 16,
                                           "vocab_size": 300, "block_size": 32})";
  }
  expect_invalid([&] { zo::model::load_model_spec((dir / "odd.json").string()); },
                 "model spec '" + (dir / "odd.json").string() + "': n_embd = 16 is not divisible");
  expect_invalid([&] { zo::model::load_model_spec((dir / "bad.json").string()); },
                 "not valid JSON");
  std::filesystem::remove_all(dir);
}

TEST(ParameterLayout, ForwardOrderAndHuggingFaceNames) {
  const ParameterLayout layout(zo::model::load_model_spec("gpt2-124m"));
  const auto& t = layout.tensors();
  EXPECT_EQ(t.front().name, "wte.weight");
  EXPECT_EQ(t[1].name, "wpe.weight");
  EXPECT_EQ(t.back().name, "ln_f.bias");
  EXPECT_EQ(t.size(), 2u + 12u * 12u + 2u);
  std::size_t expect_offset = 0;
  for (const auto& x : t) {
    EXPECT_EQ(x.offset, expect_offset) << x.name;
    expect_offset += x.numel;
  }
  EXPECT_EQ(expect_offset, layout.size());
  const auto& qkv = layout.find("h.5.attn.c_attn.weight");
  EXPECT_EQ(qkv.shape, (std::vector<std::size_t>{2304, 768}));
  EXPECT_TRUE(qkv.hf_transposed);
  EXPECT_EQ(qkv.layer, 5);
  EXPECT_TRUE(layout.find("h.0.mlp.c_proj.weight").residual_projection);
  EXPECT_EQ(layout.block_begin(5), layout.find("h.5.ln_1.weight").offset);
  EXPECT_EQ(layout.block_end(5), layout.find("h.6.ln_1.weight").offset);
  zo::model::WeightDecayPolicy wd;
  EXPECT_TRUE(wd.applies_to(qkv));
  EXPECT_FALSE(wd.applies_to(layout.find("h.5.attn.c_attn.bias")));
  EXPECT_FALSE(wd.applies_to(layout.find("wte.weight")));
  EXPECT_THROW(layout.find("lm_head.weight"), std::out_of_range);
}

TEST(ParameterLayout, Gpt2InitStatistics) {
  const ModelSpec spec = zo::model::model_spec_from_json(
      {{"n_layer", 4}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 500}, {"block_size", 64}},
      "t");
  const ParameterLayout layout(spec);
  std::vector<float> p(layout.size()), q(layout.size()), r(layout.size());
  zo::model::init_weights(layout, 7, p.data());
  zo::model::init_weights(layout, 7, q.data());
  zo::model::init_weights(layout, 8, r.data());
  EXPECT_EQ(p, q);
  EXPECT_NE(p, r);
  auto stddev = [&](const std::string& name) {
    const auto& t = layout.find(name);
    double s = 0, s2 = 0;
    for (std::size_t i = 0; i < t.numel; ++i) {
      s += p[t.offset + i];
      s2 += double(p[t.offset + i]) * p[t.offset + i];
    }
    const double count = static_cast<double>(t.numel);
    return std::sqrt(s2 / count - (s / count) * (s / count));
  };
  EXPECT_NEAR(stddev("wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.1.mlp.c_fc.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("h.1.mlp.c_proj.weight"), 0.02 / std::sqrt(8.0), 0.0007);
  EXPECT_EQ(p[layout.find("h.2.ln_2.weight").offset], 1.0f);
  EXPECT_EQ(p[layout.find("h.2.attn.c_attn.bias").offset + 3], 0.0f);
}

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, MatchesPublishedKnownAnswers) {
  using zo::model::philox4x32_10;
  using P = zo::model::Philox4x32;
  EXPECT_EQ(philox4x32_10(P{0, 0, 0, 0}, 0, 0),
            (P{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10(P{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff, 0xffffffff),
      (P{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10(P{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822, 0x299f31d0),
      (P{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The parallel fill equals an element-by-element scalar evaluation of the documented stream, on
// one thread and on all of them, for a tensor whose size is not a multiple of the block of four.
TEST(ParameterLayout, Gpt2InitIsCounterBasedAndThreadCountFree) {
  const ModelSpec spec = zo::model::model_spec_from_json(
      {{"n_layer", 2}, {"n_head", 3}, {"n_embd", 33}, {"vocab_size", 1001}, {"block_size", 17}},
      "t");
  const ParameterLayout layout(spec);
  const std::uint64_t seed = 0x123456789abcull;
  std::vector<float> all(layout.size()), one(layout.size());
  zo::model::init_weights(layout, seed, all.data());
  {
    tbb::global_control single(tbb::global_control::max_allowed_parallelism, 1);
    zo::model::init_weights(layout, seed, one.data());
  }
  EXPECT_EQ(all, one);
  std::uint32_t index = 0;
  for (const auto& t : layout.tensors()) {
    ++index;
    if (t.kind != zo::model::TensorKind::kMatrix && t.kind != zo::model::TensorKind::kEmbedding)
      continue;
    const double stddev = t.residual_projection ? 0.02 / std::sqrt(2.0 * spec.n_layer) : 0.02;
    for (std::size_t i : {std::size_t{0}, std::size_t{3}, t.numel / 2 + 1, t.numel - 1}) {
      const std::uint64_t block = i / 4;
      const auto bits =
          zo::model::philox4x32_10({std::uint32_t(block), std::uint32_t(block >> 32), index, 0},
                                   std::uint32_t(seed), std::uint32_t(seed >> 32));
      // Box-Muller written out again: pair i%4/2, cosine for even i, sine for odd.
      const int pair = int(i % 4) / 2;
      const double r = std::sqrt(-2.0 * std::log((bits[2 * pair] + 1.0) / 4294967296.0));
      const double angle = 2.0 * M_PI * (bits[2 * pair + 1] / 4294967296.0);
      const double z = r * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
      EXPECT_EQ(all[t.offset + i], static_cast<float>(stddev * z)) << t.name << "[" << i << "]";
    }
  }
  // Any range of the layout (what one data-parallel rank owns) is that slice of the whole, at
  // boundaries inside the blocks of four and across tensors.
  std::mt19937 rng(5);
  for (int k = 0; k < 40; ++k) {
    std::size_t b = rng() % layout.size(), e = rng() % (layout.size() + 1);
    if (b > e) std::swap(b, e);
    std::vector<float> part(e - b, -7.0f);
    zo::model::init_weights(layout, seed, b, e, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + std::ptrdiff_t(b)))
        << "[" << b << ", " << e << ")";
  }
}

// ---- the whole model's gradient vs central finite differences ---------------------------------
struct TinyModel {
  ModelSpec spec;
  ParameterLayout layout;
  std::unique_ptr<zo::dev::Device> dev;
  std::unique_ptr<zo::dev::Stream> stream;
  zo::dev::Buffer params, grads;
  std::vector<std::int32_t> tokens, targets;

  explicit TinyModel(std::uint64_t seed)
      : spec(zo::model::model_spec_from_json(
            {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 8}, {"vocab_size", 11}, {"block_size", 6}},
            "tiny-fd")),
        layout(spec),
        dev(zo::dev::make_host_device({})),
        stream(dev->create_stream()) {
    params = dev->alloc(layout.size() * 4, "params");
    grads = dev->alloc(layout.size() * 4, "grads");
    std::vector<float> host(layout.size());
    zo::model::init_weights(layout, seed, host.data());
    // Random LayerNorm affine and biases too, so that every parameter has a non-trivial gradient.
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (const auto& t : layout.tensors()) {
      if (t.kind == zo::model::TensorKind::kMatrix || t.kind == zo::model::TensorKind::kEmbedding) {
        for (std::size_t i = 0; i < t.numel; ++i)
          host[t.offset + i] *= 10.0f;
      } else {
        for (std::size_t i = 0; i < t.numel; ++i)
          host[t.offset + i] += normal(rng);
      }
    }
    set_params(host);
    std::uniform_int_distribution<int> tok(0, spec.vocab_size - 1);
    for (int i = 0; i < 2 * 5; ++i) {
      tokens.push_back(tok(rng));
      targets.push_back(tok(rng));
    }
  }
  void set_params(const std::vector<float>& host) {
    dev->copy_to_device(params.data(), host.data(), host.size() * 4, *stream);
    stream->synchronize();
  }
  // Mean loss over the batch; with grads, dL/dparams accumulated into `grads`.
  double loss(Gpt& gpt, bool with_grads) {
    const float scale = with_grads ? 1.0f / 10.0f : 0.0f;
    gpt.set_batch(tokens, targets, *stream);
    gpt.forward(params.data(), 5, true, scale, *stream);
    if (with_grads) gpt.backward(params.data(), grads.data(), *stream);
    std::vector<float> losses(10);
    dev->copy_to_host(losses.data(), gpt.losses(), 40, *stream);
    stream->synchronize();
    return std::accumulate(losses.begin(), losses.end(), 0.0) / 10.0;
  }
  std::vector<float> read(const zo::dev::Buffer& b) {
    std::vector<float> out(layout.size());
    dev->copy_to_host(out.data(), b.data(), out.size() * 4, *stream);
    stream->synchronize();
    return out;
  }
};

TEST(Gpt, GradientMatchesFiniteDifferences) {
  TinyModel m(3);
  Gpt gpt(*m.dev, m.layout, {2, 5, false});
  m.dev->fill_zero(m.grads.data(), m.grads.bytes(), *m.stream);
  const double base = m.loss(gpt, true);
  EXPECT_GT(base, 0.5);
  const std::vector<float> grad = m.read(m.grads);
  std::vector<float> p = m.read(m.params);

  // A few parameters from every tensor.
  std::mt19937 rng(17);
  int checked = 0;
  for (const auto& t : m.layout.tensors()) {
    std::uniform_int_distribution<std::size_t> pick(0, t.numel - 1);
    for (int k = 0; k < 3; ++k) {
      std::size_t i = t.offset + pick(rng);
      if (t.name == "wpe.weight") i = t.offset + pick(rng) % (5 * 8);  // only rows 0..4 are used
      const float orig = p[i];
      const float h = 1e-2f * std::max(1.0f, std::fabs(orig));
      p[i] = orig + h;
      m.set_params(p);
      const double up = m.loss(gpt, false);
      p[i] = orig - h;
      m.set_params(p);
      const double down = m.loss(gpt, false);
      p[i] = orig;
      const double fd = (up - down) / (2.0 * double(h));
      EXPECT_NEAR(grad[i], fd, 2e-3 + 2e-2 * std::fabs(fd))
          << t.name << " element " << i - t.offset;
      ++checked;
    }
  }
  m.set_params(p);
  EXPECT_EQ(checked, int(m.layout.tensors().size()) * 3);
}

TEST(Gpt, RecomputeGivesIdenticalGradientsAndAccumulates) {
  TinyModel m(5);
  Gpt plain(*m.dev, m.layout, {2, 5, false});
  Gpt recompute(*m.dev, m.layout, {2, 5, true});
  m.dev->fill_zero(m.grads.data(), m.grads.bytes(), *m.stream);
  const double l1 = m.loss(plain, true);
  const std::vector<float> g1 = m.read(m.grads);
  m.dev->fill_zero(m.grads.data(), m.grads.bytes(), *m.stream);
  const double l2 = m.loss(recompute, true);
  const std::vector<float> g2 = m.read(m.grads);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, g2);
  m.loss(recompute, true);  // a second micro-batch adds the same gradient again
  const std::vector<float> g3 = m.read(m.grads);
  for (std::size_t i = 0; i < g3.size(); ++i)
    ASSERT_NEAR(g3[i], 2.0f * g1[i], 1e-6f + 1e-5f * std::fabs(g1[i]));
  EXPECT_GT(zo::model::activation_bytes(m.spec, {2, 5, false}, 4),
            zo::model::activation_bytes(m.spec, {2, 5, true}, 4));
}

TEST(Gpt, RejectsBadShapesAndTokens) {
  TinyModel m(1);
  expect_invalid([&] { Gpt g(*m.dev, m.layout, {2, 7, false}); }, "block_size = 6");
  Gpt gpt(*m.dev, m.layout, {2, 5, false});
  expect_invalid([&] { gpt.set_batch({1, 2, 3}, {}, *m.stream); }, "expects 10");
  std::vector<std::int32_t> bad(10, 0);
  bad[4] = 11;
  expect_invalid([&] { gpt.set_batch(bad, {}, *m.stream); }, "token id 11");
  EXPECT_THROW(gpt.backward(m.params.data(), m.grads.data(), *m.stream), std::logic_error);
}

}  // namespace
