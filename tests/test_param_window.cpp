// Stream mode (offload/param_window.h) on the host backend: an engine that holds only a window of
// K block slots on the device trains exactly like the engine that holds every parameter: the
// same losses, master weights, m and v, bit for bit, over steps whose updates overlap the next
// forward, for GPT-2 (tied head) and Llama (untied), recompute on and off, one micro-batch and
// three (summed on the host), K = 2 and 3. Released slots are filled with NaN before they take a
// group, so a read the model did not announce, or a fill that overtook a kernel, shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/device.h"
#include "engine_rig.h"
#include "model/layout.h"
#include "model/model.h"
#include "offload/engine.h"
#include "offload/param_window.h"
#include "optim/host_optimizer.h"

namespace {

using zo::offload::Engine;
using zo::offload::EngineConfig;
using zo::optim::HostOptimizer;
using zo::test::Batches;

const zo::model::ModelSpec& llama_spec() {
  static const auto s = zo::model::model_spec_from_json({{"model_type", "llama"},
                                                         {"hidden_size", 24},
                                                         {"num_hidden_layers", 4},
                                                         {"num_attention_heads", 4},
                                                         {"num_key_value_heads", 2},
                                                         {"head_dim", 6},
                                                         {"intermediate_size", 20},
                                                         {"vocab_size", 97},
                                                         {"max_position_embeddings", 16},
                                                         {"rms_norm_eps", 1e-5},
                                                         {"rope_theta", 100.0},
                                                         {"tie_word_embeddings", false}},
                                                        "window-llama");
  return s;
}

struct Trained {
  std::vector<float> losses, master, m, v;
};

// `steps` steps of A micro-batches through an engine with config c; the update of each step runs
// while the next step's forward reads the groups it has finished.
Trained train(const zo::model::ModelSpec& spec, EngineConfig c, bool recompute, int steps) {
  const zo::model::ParameterLayout layout(spec);
  auto d = zo::dev::make_host_device({});
  auto s = d->create_stream();
  zo::optim::OptimizerConfig oc;
  oc.adam.weight_decay = 0.1f;
  oc.threads = 2;
  HostOptimizer opt(layout, oc);
  zo::model::init_weights(layout, 5, opt.master().data());
  const int B = 2, T = 16, A = c.grad_accum;
  Engine e(*d, *s, layout, opt, c);
  e.upload_all();
  const auto model = zo::model::make_model(*d, layout, {B, T, recompute});
  const float dloss = 1.0f / float(B * T * A);
  Trained r;
  for (int step = 0; step < steps; ++step) {
    const Batches b(A, B * T, 300 + std::uint64_t(step));
    e.begin_step(false);
    for (int k = 0; k < A; ++k) {
      model->set_batch(b.tokens[std::size_t(k)], b.targets[std::size_t(k)], *s);
      model->forward(e, T, true, dloss, *s);
      e.begin_micro_batch(k);
      model->backward(e, *s);
      s->synchronize();  // the compute stream only: the update may still run
      const auto l = zo::test::download(*d, model->losses(), std::size_t(B) * T);
      r.losses.insert(r.losses.end(), l.begin(), l.end());
    }
    const auto st = e.finish_gradients();
    EXPECT_FALSE(st.nonfinite) << "step " << step;
    e.start_update(3e-3f, 1.0f);
  }
  e.drain();
  const std::size_t n = layout.size();
  r.master.assign(opt.master().begin(), opt.master().end());
  const auto* m = static_cast<const float*>(opt.exp_avg().data);
  const auto* v = static_cast<const float*>(opt.exp_avg_sq().data);
  r.m.assign(m, m + n);
  r.v.assign(v, v + n);
  return r;
}

struct WindowCase {
  const char* name;
  bool llama, recompute;
  int accum;
};

class ParamWindowTest : public ::testing::TestWithParam<WindowCase> {};

TEST_P(ParamWindowTest, StreamEqualsOffloadBitForBit) {
  const WindowCase& w = GetParam();
  const zo::model::ModelSpec& spec = w.llama ? llama_spec() : zo::test::odd_spec();
  EngineConfig c;
  c.bucket_bytes = 5000;
  c.grad_accum = w.accum;
  const Trained want = train(spec, c, w.recompute, 3);
  for (const int K : {2, 3}) {
    SCOPED_TRACE("window of " + std::to_string(K));
    c.param_window = K;
    c.poison_window = true;
    const Trained got = train(spec, c, w.recompute, 3);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.master, want.master);
    EXPECT_EQ(got.m, want.m);
    EXPECT_EQ(got.v, want.v);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ParamWindowTest,
                         ::testing::Values(WindowCase{"gpt2", false, false, 1},
                                           WindowCase{"gpt2_recompute_accum3", false, true, 3},
                                           WindowCase{"llama_untied", true, false, 3},
                                           WindowCase{"llama_recompute", true, true, 1}),
                         [](const auto& c) { return std::string(c.param.name); });

// The device holds the two end groups and K slots of the largest block: for this Llama, with
// 4 blocks, K = 2 is less than offload mode's every parameter.
TEST(ParamWindow, DeviceBytesAreTheEndsAndKBlocks) {
  const zo::model::ParameterLayout layout(llama_spec());
  const auto& g = layout.groups();
  const std::size_t block = g[1].size(), ends = g.front().size() + g.back().size();
  for (const int K : {2, 3}) {
    const std::size_t bytes = zo::offload::ParamWindow::device_bytes(layout, 2, K);
    EXPECT_GE(bytes, (ends + std::size_t(K) * block) * 2);
    EXPECT_LE(bytes, (ends + std::size_t(K) * block) * 2 + std::size_t(K + 4) * 256);
    EngineConfig c;
    c.param_window = K;
    EXPECT_EQ(zo::offload::engine_footprint(layout, zo::DType::kBF16, c).device_params, bytes);
  }
  EXPECT_LT(zo::offload::ParamWindow::device_bytes(layout, 2, 2), layout.size() * 2);
}

// An untied LM head's gradient bucket (V x C) has a device slot of its own, as the embeddings'
// do, so the ring's slots are sized by the largest other bucket; the engine allocates exactly the
// footprint, in offload and in stream mode.
TEST(ParamWindow, AnUntiedHeadsGradientBucketHasASlotOfItsOwn) {
  const zo::model::ParameterLayout layout(llama_spec());
  for (const int window : {0, 2}) {
    EngineConfig c;
    c.bucket_bytes = 5000;  // the head (97 x 24 fp32) is a bucket of its own
    c.param_window = window;
    const auto plan = zo::offload::engine_bucket_plan(layout, zo::DType::kF32, c);
    std::size_t own = 0, ring = 0, heads = 0;
    for (const auto& b : plan.buckets()) {
      const bool head = b.begin <= layout.lm_head() && layout.lm_head() < b.end;
      EXPECT_EQ(b.own_slot, b.embeddings || head) << "bucket " << b.index;
      heads += head;
      if (b.own_slot) own += b.size();
      if (!b.own_slot) ring = std::max(ring, b.size());
    }
    EXPECT_EQ(heads, 1u);
    ASSERT_LT(ring, layout.tensors().back().numel) << "the head is the largest bucket";
    const auto f = zo::offload::engine_footprint(layout, zo::DType::kF32, c);
    EXPECT_EQ(f.device_grad_slots, (own + std::size_t(c.device_slots) * ring) * 4);
    auto d = zo::dev::make_host_device({});
    auto s = d->create_stream();
    HostOptimizer opt(layout, {});
    const std::size_t before = d->used_bytes();
    Engine e(*d, *s, layout, opt, c);
    EXPECT_EQ(d->used_bytes() - before, f.device_params + f.device_grad_slots + f.device_stats)
        << "window " << window;
  }
}

// A read of a group that is not in the window is an error when it is enqueued; a window needs
// two slots; stream mode refuses a delayed update by name.
TEST(ParamWindow, UnannouncedReadsAndBadSettingsAreRefused) {
  const zo::model::ParameterLayout layout(llama_spec());
  auto d = zo::dev::make_host_device({});
  auto compute = d->create_stream(), h2d = d->create_stream();
  zo::offload::ParamWindow w(*d, *compute, *h2d, layout, 2, false);
  EXPECT_NO_THROW(w.param(layout.wte()));
  EXPECT_NO_THROW(w.param(layout.lm_head()));
  try {
    w.param(layout.llama_block(1).o_w);
    ADD_FAILURE() << "read of block 1 outside the window";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("block 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(zo::offload::ParamWindow(*d, *compute, *h2d, layout, 1, false),
               std::invalid_argument);

  HostOptimizer opt(layout, {});
  EngineConfig c;
  c.param_window = 2;
  c.dpu = true;
  try {
    Engine e(*d, *compute, layout, opt, c);
    ADD_FAILURE() << "stream mode with DPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("DPU"), std::string::npos) << e.what();
  }
}

}  // namespace
