// The models' parameter-read protocol (ParameterStore): every parameter a forward, backward,
// recompute or decode step reads belongs to the group announced last. The check is a store that
// holds one group on the device at a time, the one-slot case of a parameter window: announcing
// a group poisons the one held before with NaN and copies the new one in, in stream order. A
// read of another group through param() is recorded when it is made; a read through a pointer
// kept from an earlier group reads NaN, which reaches the losses, logits or gradients. Losses,
// logits and gradients must equal those of the flat store bit for bit, for GPT-2 and the Llama
// family, tied and untied heads, recompute on and off.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/spec.h"

namespace {

using zo::dev::Buffer;
using zo::dev::Device;
using zo::dev::Stream;
using zo::model::ParameterLayout;

class OneGroupResident final : public zo::model::ParameterStore {
 public:
  OneGroupResident(Device& d, Stream& s, const ParameterLayout& layout, const void* params,
                   void* grads)
      : d_(d), s_(s), layout_(layout), params_(params), grads_(static_cast<char*>(grads)) {
    const std::size_t bytes = layout.size() * esize_;
    window_ = d.alloc(bytes, "one-group window");
    nans_ = d.alloc(bytes, "NaN");
    const std::vector<unsigned char> ones(bytes, 0xFF);  // NaN in fp32, bf16 and fp16 alike
    d.copy_to_device(nans_.data(), ones.data(), bytes, s);
    d.copy_on_device(window_.data(), nans_.data(), bytes, s);
    s.synchronize();
  }

  const void* param(std::size_t offset) override {
    if (layout_.group_of(offset) != held_) {
      misreads_.push_back(layout_.tensors()[tensor_at(offset)].name + " of group " +
                          std::to_string(layout_.group_of(offset)) + " while group " +
                          std::to_string(held_) + " is held");
    }
    return window_.as<char>() + offset * esize_;
  }
  const void* params() override { return window_.data(); }
  void before_read(std::size_t g) override {
    announced_.push_back(g);
    if (g == held_) return;
    if (held_ != kNone) copy(held_, nans_.data());
    copy(g, params_);
    held_ = g;
  }
  void* grad(std::size_t offset) override { return grads_ + offset * esize_; }

  std::vector<std::size_t> take_announced() { return std::exchange(announced_, {}); }
  const std::vector<std::string>& misreads() const { return misreads_; }

 private:
  static constexpr std::size_t kNone = ~std::size_t{0};
  void copy(std::size_t g, const void* from) {
    const zo::model::Range& r = layout_.groups()[g];
    d_.copy_on_device(window_.as<char>() + r.begin * esize_,
                      static_cast<const char*>(from) + r.begin * esize_, r.size() * esize_, s_);
  }
  std::size_t tensor_at(std::size_t offset) const {
    const auto& t = layout_.tensors();
    std::size_t i = 0;
    while (i + 1 < t.size() && t[i + 1].offset <= offset)
      ++i;
    return i;
  }

  Device& d_;
  Stream& s_;
  const ParameterLayout& layout_;
  const void* params_;
  char* grads_;
  const std::size_t esize_ = 4;  // the host backend's fp32
  Buffer window_, nans_;
  std::size_t held_ = kNone;
  std::vector<std::size_t> announced_;
  std::vector<std::string> misreads_;
};

struct Case {
  const char* name;
  nlohmann::json spec;
};

// A Hugging Face config of a small Llama-family model with odd widths.
nlohmann::json llama(const char* type, int layers, bool tie) {
  return {{"model_type", type},       {"hidden_size", 12},        {"num_hidden_layers", layers},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 6},
          {"intermediate_size", 10},  {"vocab_size", 13},         {"max_position_embeddings", 7},
          {"rms_norm_eps", 1e-5},     {"rope_theta", 100.0},      {"tie_word_embeddings", tie}};
}

// The GPT-2 head is tied, the Llama one untied, Qwen2's (with q/k/v biases) tied.
const Case kCases[] = {
    {"gpt2",
     {{"n_layer", 3}, {"n_head", 2}, {"n_embd", 10}, {"vocab_size", 13}, {"block_size", 7}}},
    {"llama_untied", llama("llama", 3, false)},
    {"qwen2_tied_biases", llama("qwen2", 2, true)},
};

struct Rig {
  zo::model::ModelSpec spec;
  ParameterLayout layout;
  std::unique_ptr<Device> dev = zo::dev::make_host_device({});
  std::unique_ptr<Stream> stream = dev->create_stream();
  Buffer params;
  std::vector<std::int32_t> tokens, targets;
  static constexpr int B = 2, T = 7;

  explicit Rig(const nlohmann::json& j)
      : spec(zo::model::model_spec_from_json(j, "t")), layout(spec) {
    std::vector<float> host(layout.size());
    std::mt19937 rng(11);
    std::normal_distribution<float> n(0.0f, 0.5f);
    for (float& x : host)
      x = n(rng);
    params = dev->alloc(host.size() * 4, "params");
    dev->copy_to_device(params.data(), host.data(), host.size() * 4, *stream);
    std::uniform_int_distribution<int> tok(0, spec.vocab_size - 1);
    for (int i = 0; i < B * T; ++i) {
      tokens.push_back(tok(rng));
      targets.push_back(tok(rng));
    }
    stream->synchronize();
  }
  std::vector<float> read(const void* p, std::size_t n) {
    std::vector<float> out(n);
    dev->copy_to_host(out.data(), p, n * 4, *stream);
    stream->synchronize();
    return out;
  }
  // Losses and gradients of one training forward and backward through `store`.
  std::pair<std::vector<float>, std::vector<float>> step(zo::model::Model& m,
                                                         zo::model::ParameterStore& store,
                                                         Buffer& grads) {
    dev->fill_zero(grads.data(), grads.bytes(), *stream);
    m.set_batch(tokens, targets, *stream);
    m.forward(store, T, true, 1.0f / (B * T), *stream);
    m.backward(store, *stream);
    return {read(m.losses(), std::size_t(B) * T), read(grads.data(), layout.size())};
  }
};

class ParameterGroups : public ::testing::TestWithParam<Case> {};

TEST_P(ParameterGroups, EveryReadIsOfTheGroupAnnouncedLast) {
  Rig rig(GetParam().spec);
  const std::size_t L = std::size_t(rig.spec.n_layer);
  const std::size_t head = rig.layout.group_of(rig.layout.lm_head());
  EXPECT_EQ(head, rig.spec.tie_word_embeddings ? 0 : L + 1);
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    const auto m = zo::model::make_model(*rig.dev, rig.layout, {Rig::B, Rig::T, recompute});
    Buffer flat_grads = rig.dev->alloc(rig.layout.size() * 4, "grads");
    Buffer grads = rig.dev->alloc(rig.layout.size() * 4, "grads");
    zo::model::FlatParameters flat(rig.params.data(), flat_grads.data(), rig.dev->act_dtype());
    OneGroupResident one(*rig.dev, *rig.stream, rig.layout, rig.params.data(), grads.data());
    const auto want = rig.step(*m, flat, flat_grads);
    const auto got = rig.step(*m, one, grads);
    EXPECT_EQ(got.first, want.first) << "losses";
    EXPECT_EQ(got.second, want.second) << "gradients";
    EXPECT_TRUE(one.misreads().empty()) << one.misreads().front();

    // Forward 0 .. L + 1 and the head's group; backward the head's, L + 1, L .. 1.
    std::vector<std::size_t> order;
    for (std::size_t g = 0; g <= L + 1; ++g)
      order.push_back(g);
    if (head != L + 1) order.push_back(head);
    order.push_back(head);
    if (head != L + 1) order.push_back(L + 1);
    for (std::size_t g = L; g >= 1; --g)
      order.push_back(g);
    EXPECT_EQ(one.take_announced(), order);
  }
}

TEST_P(ParameterGroups, DecodeReadsOnlyTheGroupAnnouncedLast) {
  Rig rig(GetParam().spec);
  const auto m = zo::model::make_model(*rig.dev, rig.layout, {1, Rig::T, false});
  Buffer grads = rig.dev->alloc(rig.layout.size() * 4, "grads");
  zo::model::FlatParameters flat(rig.params.data(), nullptr, rig.dev->act_dtype());
  OneGroupResident one(*rig.dev, *rig.stream, rig.layout, rig.params.data(), grads.data());
  const std::size_t V = std::size_t(m->logits_stride());
  const std::vector<std::int32_t> prompt(rig.tokens.begin(), rig.tokens.begin() + Rig::T);
  std::vector<std::vector<float>> logits[2];
  int k = 0;
  for (zo::model::ParameterStore* store : {static_cast<zo::model::ParameterStore*>(&flat),
                                           static_cast<zo::model::ParameterStore*>(&one)}) {
    m->set_batch(prompt, {}, *rig.stream);
    m->forward(*store, 3, false, 0.0f, *rig.stream);
    for (int pos = 3; pos < Rig::T; ++pos) {
      m->set_token(pos, prompt[std::size_t(pos)], *rig.stream);
      m->decode(*store, pos, *rig.stream);
      const auto all = rig.read(m->logits(), std::size_t(pos + 1) * V);
      logits[k].emplace_back(all.end() - std::ptrdiff_t(V), all.end());
    }
    ++k;
  }
  EXPECT_EQ(logits[1], logits[0]);
  EXPECT_TRUE(one.misreads().empty()) << one.misreads().front();
}

INSTANTIATE_TEST_SUITE_P(Models, ParameterGroups, ::testing::ValuesIn(kCases),
                         [](const auto& c) { return std::string(c.param.name); });

}  // namespace
