// Sampling with the KV cache on the host backend: every decode step's logits against the full
// forward's at that position (GPT-2 and the Llama family), greedy generation with the cache
// against the old path (a forward over the whole context for every token) and through a window of
// streamed blocks, bad input; and the
// token sampler (temperature, top-k, top-p) against the renormalised probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "decode_check.h"
#include "device/device.h"
#include "input_test.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/spec.h"
#include "offload/windowed_parameters.h"
#include "train/sample.h"

namespace {

using zo::model::Model;

// A host-backend model with weights sharp enough that greedy picks are far from ties.
struct CachedModel {
  zo::model::ParameterLayout layout;
  std::unique_ptr<zo::dev::Device> dev = zo::dev::make_host_device({});
  std::unique_ptr<zo::dev::Stream> stream = dev->create_stream();
  zo::dev::Buffer params;

  explicit CachedModel(const std::string& preset) : layout(zo::model::load_model_spec(preset)) {
    std::vector<float> w(layout.size());
    zo::model::init_weights(layout, 11, w.data());
    for (const auto& ti : layout.tensors()) {
      if (ti.kind != zo::model::TensorKind::kMatrix && ti.kind != zo::model::TensorKind::kEmbedding)
        continue;
      for (std::size_t i = 0; i < ti.numel; ++i)
        w[ti.offset + i] *= 8.0f;
    }
    params = dev->alloc(w.size() * 4, "parameters");
    dev->copy_to_device(params.data(), w.data(), w.size() * 4, *stream);
    stream->synchronize();
  }
  std::vector<std::int32_t> tokens(std::size_t n, unsigned seed) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> id(0, layout.spec().vocab_size - 1);
    std::vector<std::int32_t> t(n);
    for (auto& x : t)
      x = id(rng);
    return t;
  }
};

std::int32_t argmax(const std::vector<float>& logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The old path: a forward over the whole context for every new token, with generate_with's
// context policy written out again (a prompt longer than T keeps its last T tokens; a full
// context keeps its last max(1, T/2)).
std::vector<std::int32_t> generate_full_window(Model& m, const void* params, zo::dev::Device& dev,
                                               zo::dev::Stream& s, std::vector<std::int32_t> seq,
                                               int new_tokens) {
  const std::size_t T = std::size_t(m.shape().T), V = std::size_t(m.layout().spec().vocab_size);
  std::size_t start = seq.size() > T ? seq.size() - T : 0;
  std::vector<float> logits(V);
  for (int k = 0; k < new_tokens; ++k) {
    if (seq.size() - start > T) start = seq.size() - std::max<std::size_t>(1, T / 2);
    const std::size_t t = seq.size() - start;
    std::vector<std::int32_t> window(T, 0);
    std::copy(seq.begin() + std::ptrdiff_t(start), seq.end(), window.begin());
    m.set_batch(window, {}, s);
    m.forward(params, int(t), false, 0.0f, s);
    dev.copy_to_host(logits.data(), static_cast<const float*>(m.logits()) + (t - 1) * V, V * 4, s);
    s.synchronize();
    seq.push_back(argmax(logits));
  }
  return seq;
}

class SampleCache : public ::testing::TestWithParam<const char*> {};

TEST_P(SampleCache, DecodeStepsEqualTheFullForward) {
  CachedModel su(GetParam());
  const auto tokens = su.tokens(23, 3);
  for (const int prefill : {1, 6}) {
    SCOPED_TRACE("prefill " + std::to_string(prefill));
    const auto r =
        zo::test::decode_vs_forward(*su.dev, su.layout, su.params.data(), tokens, prefill);
    ASSERT_EQ(r.decoded.size(), r.forward.size());
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < r.forward.size(); ++i) {
      worst = std::max(worst, std::abs(double(r.decoded[i]) - r.forward[i]));
      scale = std::max(scale, std::abs(double(r.forward[i])));
    }
    EXPECT_GT(scale, 1.0) << "logits too flat to tell anything apart";
    EXPECT_LE(worst, 1e-5 * scale) << "largest |decoded - forward| over every position";
  }
}

// Greedy with the cache against the old path, through two refills of the context and from a
// prompt longer than it.
TEST_P(SampleCache, GreedyEqualsTheFullWindowPath) {
  CachedModel su(GetParam());
  const int T = 16;
  const auto cached = zo::model::make_model(*su.dev, su.layout, {1, T, false});
  const auto full = zo::model::make_model(*su.dev, su.layout, {1, T, false});
  for (const std::size_t prompt_len : {std::size_t{3}, std::size_t{T + 5}}) {
    SCOPED_TRACE("prompt of " + std::to_string(prompt_len));
    const auto prompt = su.tokens(prompt_len, 5);
    zo::model::FlatParameters flat(su.params.data(), nullptr, su.dev->act_dtype());
    const auto got =
        zo::train::generate_with(*cached, flat, *su.dev, *su.stream, prompt, 30, argmax);
    const auto want =
        generate_full_window(*full, su.params.data(), *su.dev, *su.stream, prompt, 30);
    EXPECT_EQ(got, want);
    // The weights in host memory, the blocks streamed through a window of 2 slots: the same.
    std::vector<float> host(su.layout.size());
    su.dev->copy_to_host(host.data(), su.params.data(), host.size() * 4, *su.stream);
    su.stream->synchronize();
    zo::offload::WindowedParameters window(*su.dev, *su.stream, su.layout, host.data(), 2);
    EXPECT_EQ(zo::train::generate_with(*cached, window, *su.dev, *su.stream, prompt, 30, argmax),
              got);
    ASSERT_EQ(got.size(), prompt_len + 30);
    // Not one token repeated: the comparison sees distinct picks.
    EXPECT_GT(std::set<std::int32_t>(got.begin() + std::ptrdiff_t(prompt_len), got.end()).size(),
              2u);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SampleCache, ::testing::Values("tiny", "tiny-llama", "tiny-qwen2"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string n = p.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(SampleCacheInput, DecodeRefusesWhatTheCacheDoesNotHold) {
  CachedModel su("tiny-llama");
  const auto m = zo::model::make_model(*su.dev, su.layout, {1, 8, false});
  m->set_batch(su.tokens(8, 1), {}, *su.stream);
  EXPECT_HAS(zo::test::error_of([&] { m->decode(su.params.data(), 1, *su.stream); }),
             "pos <= the 0 positions cached (forward over the prompt first)");
  m->forward(su.params.data(), 3, false, 0.0f, *su.stream);
  EXPECT_HAS(zo::test::error_of([&] { m->decode(su.params.data(), 4, *su.stream); }),
             "decode at position 4: need 0 <= pos < T = 8 and pos <= the 3 positions cached");
  m->decode(su.params.data(), 3, *su.stream);
  EXPECT_HAS(zo::test::error_of([&] { m->decode(su.params.data(), 8, *su.stream); }),
             "pos < T = 8");
  EXPECT_HAS(zo::test::error_of([&] { m->set_token(2, 256, *su.stream); }),
             "token id 256 is outside the model's vocabulary [0, 256)");
  const auto batched = zo::model::make_model(*su.dev, su.layout, {2, 8, false});
  EXPECT_HAS(zo::test::error_of([&] { batched->decode(su.params.data(), 0, *su.stream); }),
             "decode needs a model of micro-batch 1 without recompute (micro-batch 2)");
  su.stream->synchronize();

  zo::train::SampleConfig c;
  c.weights.checkpoint = "unused";
  EXPECT_HAS(zo::test::error_of([&] { zo::train::generate(c); }),
             "the prompt is empty: give --prompt or --prompt-tokens");
}

// ---- the sampler -------------------------------------------------------------------------------

// Five tokens of probabilities 0.5, 0.2, 0.15, 0.1, 0.05, shuffled over the ids, as logits.
struct KnownDistribution {
  std::vector<float> logits;
  std::vector<int> id;  // id[r]: the token of rank r
  KnownDistribution() : logits(5), id{3, 0, 4, 1, 2} {
    const double p[5] = {0.5, 0.2, 0.15, 0.1, 0.05};
    for (int r = 0; r < 5; ++r)
      logits[static_cast<std::size_t>(id[r])] = static_cast<float>(std::log(p[r]) + 7.0);
  }
};

// Frequencies of 40,000 draws against the renormalised probabilities of the kept ranks (p in
// rank order; ranks past it must never be drawn).
void expect_frequencies(zo::train::TokenSampler& pick, const KnownDistribution& d,
                        const std::vector<double>& p) {
  const int draws = 40000;
  std::vector<int> count(5, 0);
  for (int i = 0; i < draws; ++i)
    ++count[static_cast<std::size_t>(pick(d.logits))];
  double total = 0.0;
  for (double x : p)
    total += x;
  for (std::size_t r = 0; r < 5; ++r) {
    const double want = r < p.size() ? p[r] / total : 0.0;
    const double got = double(count[static_cast<std::size_t>(d.id[r])]) / draws;
    EXPECT_NEAR(got, want, 0.015) << "rank " << r;  // 4 standard deviations at most
    if (r >= p.size()) {
      EXPECT_EQ(count[static_cast<std::size_t>(d.id[r])], 0) << "rank " << r;
    }
  }
}

TEST(SampleSampler, TopKAndTopPKeepTheMostLikelyAndRenormalise) {
  const KnownDistribution d;
  zo::train::TokenSampler all(1.0f, 0, 1.0f, 11);
  expect_frequencies(all, d, {0.5, 0.2, 0.15, 0.1, 0.05});
  zo::train::TokenSampler top2(1.0f, 2, 1.0f, 12);
  expect_frequencies(top2, d, {0.5, 0.2});
  // 0.5 + 0.2 = 0.7 < 0.8, so the nucleus takes the third too.
  zo::train::TokenSampler nucleus(1.0f, 0, 0.8f, 13);
  expect_frequencies(nucleus, d, {0.5, 0.2, 0.15});
  zo::train::TokenSampler both(1.0f, 4, 0.8f, 14);  // top-k first, then the nucleus
  expect_frequencies(both, d, {0.5, 0.2, 0.15});
  zo::train::TokenSampler one(1.0f, 0, 0.3f, 15);  // the most likely alone reaches 0.3
  expect_frequencies(one, d, {0.5});
  // Temperature 0.5 squares the probabilities before they are renormalised.
  zo::train::TokenSampler cold(0.5f, 0, 1.0f, 16);
  expect_frequencies(cold, d, {0.25, 0.04, 0.0225, 0.01, 0.0025});
}

TEST(SampleSampler, GreedyIsTheFirstLargestAndSeedsRepeat) {
  const KnownDistribution d;
  zo::train::TokenSampler greedy(0.0f, 0, 0.5f, 1);
  EXPECT_EQ(greedy({1.0f, 3.0f, 3.0f, -2.0f}), 1);
  EXPECT_EQ(greedy(d.logits), d.id[0]);
  zo::train::TokenSampler a(1.0f, 0, 0.9f, 99), b(1.0f, 0, 0.9f, 99);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(a(d.logits), b(d.logits));
}

TEST(SampleSampler, RefusesBadSettingsByName) {
  const std::pair<std::function<void()>, std::string> bad[] = {
      {[] { zo::train::TokenSampler(-1.0f, 0, 1.0f, 1); }, "--temperature"},
      {[] { zo::train::TokenSampler(INFINITY, 0, 1.0f, 1); }, "--temperature"},
      {[] { zo::train::TokenSampler(1.0f, -1, 1.0f, 1); }, "--top-k"},
      {[] { zo::train::TokenSampler(1.0f, 0, 0.0f, 1); }, "--top-p"},
      {[] { zo::train::TokenSampler(1.0f, 0, 1.5f, 1); }, "--top-p"},
      {[] { zo::train::TokenSampler(1.0f, 0, NAN, 1); }, "--top-p"},
  };
  for (const auto& [make, name] : bad) {
    try {
      make();
      ADD_FAILURE() << name << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
