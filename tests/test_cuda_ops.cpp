// The CUDA backend against the host backend: the op-case table (op_cases.h: every op on random
// data with odd sizes, fp32 / bf16 / fp16, aligned and unaligned operands), the whole GPT forward
// and backward, and the device itself (memory, copies, streams, events, the matmul plan cache).
// Without a usable GPU every test skips with the reason; test_cuda_ops_simt is this file linked
// against the SIMT emulator's CUDA backend, so all of it also runs without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/half_bits.h"
#include "decode_check.h"
#include "device/cuda_device.h"
#include "device/device.h"
#include "gpu/device.h"
#include "gpu/ops.h"
#include "gpu_test_device.h"
#include "model/gpt.h"
#include "model/layout.h"
#include "model/model.h"
#include "model/spec.h"
#include "op_cases.h"
#include "op_compare.h"

// Test hooks of the SIMT emulator's cuBLASLt (tests/simt/cublaslt_fake.cpp). Weak: a GPU build
// has none, and what needs them is skipped there.
namespace zo::simt {
[[gnu::weak]] void cublaslt_refuse_epilogues(bool refuse);
[[gnu::weak]] void cublaslt_offer_algorithms(int count);
[[gnu::weak]] void cublaslt_make_fastest(int index);
[[gnu::weak]] std::uint64_t device_allocations();
[[gnu::weak]] std::uint64_t graph_launches();
}  // namespace zo::simt

namespace {

struct DestroyMatmulContext {
  void operator()(zo::gpu::MatmulContext* c) const noexcept { zo::gpu::destroy_matmul_context(c); }
};
using MatmulContextPtr = std::unique_ptr<zo::gpu::MatmulContext, DestroyMatmulContext>;

using zo::DType;
using zo::dev::Buffer;
using zo::dev::Device;
using zo::test::OpRun;
using zo::test::Tensor;

// ---- GPU availability ---------------------------------------------------------------------------

const std::string& no_gpu_reason() {
  static const std::string reason = zo::gpu::no_device_reason();
  return reason;
}

using zo::test::usable_device;

#define ZO_REQUIRE_GPU()                                           \
  do {                                                             \
    if (!no_gpu_reason().empty()) GTEST_SKIP() << no_gpu_reason(); \
  } while (0)

std::unique_ptr<Device> cuda_device(DType t, std::size_t capacity = 0) {
  zo::dev::CudaDeviceOptions o;
  o.device = usable_device();
  o.act_dtype = t;
  o.capacity_bytes = capacity;
  return zo::dev::make_cuda_device(o);
}

using zo::test::contains;
using zo::test::encode;

std::vector<float> normal_values(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x)
    v = normal(rng);
  return x;
}

// ---- the op-case table ----------------------------------------------------------------------

class CudaOps : public ::testing::TestWithParam<zo::test::OpCaseParam> {};

TEST_P(CudaOps, MatchHost) {
  ZO_REQUIRE_GPU();
  const auto [op, t] = GetParam();
  const auto host = zo::dev::make_host_device({});
  const auto gpu = cuda_device(t);
  zo::test::run_op_case(*op, t, *gpu, *host, zo::test::Compare::kTolerance);
}

// "Dtypes/": bench/gpu/run.sh runs the op tests under compute-sanitizer by that prefix.
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps,
                         ::testing::ValuesIn(zo::test::op_case_params({DType::kF32, DType::kBF16,
                                                                       DType::kF16})),
                         zo::test::op_case_name);

// ---- the whole model -------------------------------------------------------------------------

// Three small models of vocabulary 101 and 16 positions: GPT-2; GQA with head size 64 (the
// tensor-core attention in 16 bits); Qwen2's single kv head and tied head.
std::vector<nlohmann::json> small_model_configs() {
  return {
      nlohmann::json{
          {"n_layer", 2}, {"n_head", 3}, {"n_embd", 48}, {"vocab_size", 101}, {"block_size", 16}},
      nlohmann::json{{"model_type", "llama"},
                     {"hidden_size", 48},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 6},
                     {"num_key_value_heads", 2},
                     {"head_dim", 64},
                     {"intermediate_size", 37},
                     {"vocab_size", 101},
                     {"max_position_embeddings", 16}},
      nlohmann::json{{"model_type", "qwen2"},
                     {"hidden_size", 64},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 1},
                     {"intermediate_size", 40},
                     {"vocab_size", 101},
                     {"max_position_embeddings", 16},
                     {"tie_word_embeddings", true}}};
}

class CudaModel : public zo::test::DtypeOpTest {
 protected:
  void SetUp() override { ZO_REQUIRE_GPU(); }
  void expect_model_matches_host(const zo::model::ModelSpec& spec);
};

// The whole model's losses and gradients on the CUDA backend against the host backend's.
void CudaModel::expect_model_matches_host(const zo::model::ModelSpec& spec) {
  const zo::model::ParameterLayout layout(spec);
  const int B = 2, T = 13;
  const std::size_t BT = std::size_t(B) * T;
  std::vector<float> params(layout.size());
  zo::model::init_weights(layout, 7, params.data());
  // Larger weights and random LayerNorm affine / biases so that every gradient is non-trivial.
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (const auto& ti : layout.tensors()) {
    for (std::size_t i = 0; i < ti.numel; ++i) {
      float& p = params[ti.offset + i];
      if (ti.kind == zo::model::TensorKind::kMatrix ||
          ti.kind == zo::model::TensorKind::kEmbedding) {
        p *= 3.0f;
      } else {
        p += normal(rng_);
      }
    }
  }
  params = zo::test::round_to(params, t());
  const auto tok = tokens(BT, spec.vocab_size), tgt = tokens(BT, spec.vocab_size);
  struct Out {
    std::vector<float> losses, grads;
  };
  auto run = [&](Device& dev, bool recompute) {
    OpRun d(dev, t(), 0);
    const Tensor p = d.act(params), g = d.act(std::vector<float>(layout.size(), 0.0f));
    const auto model = zo::model::make_model(dev, layout, {B, T, recompute});
    model->set_batch(tok, tgt, d.s());
    // dloss_scale 1 (the gradient of the summed loss) keeps fp16 gradients out of subnormals.
    model->forward(p.p, T, true, 1.0f, d.s());
    model->backward(p.p, g.p, d.s());
    const Tensor losses{const_cast<float*>(model->losses()), BT, DType::kF32, false};
    return Out{d.get(losses), d.get(g)};
  };
  const Out want = run(*zo::dev::make_host_device({}), false);
  const bool f32 = t() == DType::kF32;
  // V = 101: the CUDA backend pads the logits rows to 128. With recompute, each block's first
  // LayerNorm is recomputed on its own instead of with the residual add before it.
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    const Out got = run(*cuda_device(t()), recompute);
    const double mean_got = std::accumulate(got.losses.begin(), got.losses.end(), 0.0) / double(BT);
    const double mean_want =
        std::accumulate(want.losses.begin(), want.losses.end(), 0.0) / double(BT);
    EXPECT_NEAR(mean_got, mean_want, (f32 ? 1e-5 : 2e-2) * mean_want) << "mean loss";
    zo::test::expect_close(got.losses, want.losses,
                           f32 ? zo::test::Tol{1e-5, 1e-4} : zo::test::Tol{2e-2, 1e-1}, "losses");
    // Per tensor, by norm: 16-bit activations compound over the layers.
    for (const auto& ti : layout.tensors()) {
      SCOPED_TRACE(ti.name);
      double diff2 = 0.0, want2 = 0.0;
      for (std::size_t i = ti.offset; i < ti.offset + ti.numel; ++i) {
        const double d = double(got.grads[i]) - double(want.grads[i]);
        diff2 += d * d;
        want2 += double(want.grads[i]) * double(want.grads[i]);
      }
      ASSERT_GT(want2, 0.0) << "zero reference gradient";
      EXPECT_LE(std::sqrt(diff2 / want2), f32 ? 1e-4 : 5e-2) << "relative gradient error norm";
    }
  }
}

TEST_P(CudaModel, GptLossAndGradientsMatchHost) {
  expect_model_matches_host(zo::model::model_spec_from_json(small_model_configs()[0], "tiny-cuda"));
}

// Grouped-query attention (6 query heads over 2 kv heads) with head size 64 (the tensor-core
// path in 16 bits), with q/k/v/o biases and Llama 3 RoPE scaling added, an untied head; and
// Qwen2's shape with one kv head, head size 16 (the FMA path) and a tied head.
TEST_P(CudaModel, LlamaFamilyLossAndGradientsMatchHost) {
  nlohmann::json llama = small_model_configs()[1];
  llama["attention_bias"] = true;
  llama["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 4.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 2.0},
                           {"original_max_position_embeddings", 8}};
  expect_model_matches_host(zo::model::model_spec_from_json(llama, "tiny-llama-cuda"));
  expect_model_matches_host(
      zo::model::model_spec_from_json(small_model_configs()[2], "tiny-qwen2-cuda"));
}

// The KV cache on the CUDA backend: after a prefill of 4 positions, each decode step's logits
// against the full forward's at that position on the same device.
TEST_P(CudaModel, DecodeStepsEqualTheFullForward) {
  for (const nlohmann::json& cfg : small_model_configs()) {
    const zo::model::ParameterLayout layout(zo::model::model_spec_from_json(cfg, "decode"));
    SCOPED_TRACE(cfg.dump());
    std::vector<float> params(layout.size());
    zo::model::init_weights(layout, 5, params.data());
    for (float& p : params)
      p *= 4.0f;  // logits far from flat
    const auto dev = cuda_device(t());
    OpRun d(*dev, t(), 0);
    const Tensor p = d.act(zo::test::round_to(params, t()));
    const auto r = zo::test::decode_vs_forward(d.dev(), layout, p.p, tokens(11, 101), 4);
    const bool f32 = t() == DType::kF32;
    zo::test::expect_close(r.decoded, r.forward,
                           f32 ? zo::test::Tol{1e-4, 1e-4} : zo::test::Tol{5e-2, 1e-1}, "logits");
  }
}

// CUDA Graphs: a model with graphs on replays recordings of its forward and backward from the
// second use of a key on; over steps with new batches, a changed loss scale and an evaluation
// forward in between, its losses and gradients equal an eager model's bit for bit.
TEST_P(CudaModel, GraphsReplayBitForBitWhatEagerRuns) {
  for (const nlohmann::json& cfg : small_model_configs()) {
    SCOPED_TRACE(cfg.dump());
    const zo::model::ParameterLayout layout(zo::model::model_spec_from_json(cfg, "graphs"));
    const int B = 2, T = 13;
    const std::size_t BT = std::size_t(B) * T;
    std::vector<float> params(layout.size());
    zo::model::init_weights(layout, 3, params.data());
    const auto dev = cuda_device(t());
    OpRun d(*dev, t(), 0);
    const Tensor p = d.act(zo::test::round_to(params, t()));
    const Tensor g_eager = d.act(std::vector<float>(layout.size(), 0.0f));
    const Tensor g_graph = d.act(std::vector<float>(layout.size(), 0.0f));
    const auto eager = zo::model::make_model(*dev, layout, {B, T, false});
    const auto graphed = zo::model::make_model(*dev, layout, {B, T, false});
    graphed->use_graphs(true);
    const std::uint64_t launches_before =
        zo::simt::graph_launches != nullptr ? zo::simt::graph_launches() : 0;
    const Tensor losses_eager{const_cast<float*>(eager->losses()), BT, DType::kF32, false};
    const Tensor losses_graph{const_cast<float*>(graphed->losses()), BT, DType::kF32, false};
    for (int step = 0; step < 5; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto tok = tokens(BT, 101), tgt = tokens(BT, 101);
      const float scale = step < 3 ? 1.0f : 0.5f;  // a new key at step 3: eager, then recorded
      for (auto* m : {eager.get(), graphed.get()}) {
        m->set_batch(tok, tgt, d.s());
        m->forward(p.p, T, true, 0.0f, d.s());  // an evaluation forward
        m->forward(p.p, T, true, scale, d.s());
        m->backward(p.p, m == eager.get() ? g_eager.p : g_graph.p, d.s());
      }
      ASSERT_EQ(d.get(losses_graph), d.get(losses_eager));
      ASSERT_EQ(d.get(g_graph), d.get(g_eager)) << "accumulated gradients";
    }
    EXPECT_EQ(graphed->graph_fallback(), "");
    if (zo::simt::graph_launches != nullptr) {
      // Step 0 runs the three keys (evaluation, training forward, backward) eagerly; steps 1
      // and 2 launch all three; step 3 launches two (its training forward has a new scale and
      // runs eagerly), step 4 all three.
      EXPECT_EQ(zo::simt::graph_launches() - launches_before, 11u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaModel,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         zo::test::dtype_param_name);

// ---- the device itself
// ----------------------------------------------------------------------------

TEST(CudaDevice, FactoryExplainsAMissingGpu) {
  if (no_gpu_reason().empty()) GTEST_SKIP() << "a usable GPU is present";
  try {
    (void)zo::dev::make_cuda_device({});
    FAIL() << "make_cuda_device returned without a usable GPU";
  } catch (const std::exception& e) {
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

TEST(CudaDevice, FactoryRejectsBadOptions) {
  ZO_REQUIRE_GPU();
  zo::dev::CudaDeviceOptions o;
  o.device = int(zo::gpu::query_devices().size()) + 3;
  EXPECT_THROW((void)zo::dev::make_cuda_device(o), std::out_of_range);
  o.device = usable_device();
  o.act_dtype = static_cast<DType>(9);
  EXPECT_THROW((void)zo::dev::make_cuda_device(o), std::invalid_argument);
}

TEST(CudaDevice, NameBackendAndDtype) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  EXPECT_EQ(dev->backend(), zo::dev::Backend::kCuda);
  EXPECT_EQ(dev->act_dtype(), DType::kBF16);
  const std::string name = dev->name();
  EXPECT_EQ(name.rfind("cuda:" + std::to_string(usable_device()) + " ", 0), 0u) << name;
  EXPECT_TRUE(contains(name, "(bf16)")) << name;
  EXPECT_TRUE(contains(cuda_device(DType::kF16)->name(), "(fp16)"));
}

// ZO_SYNC_EACH_OP=1 (read when the device is made): an op's call returns only once the op has
// run. A host function holds the stream shut until another thread opens it, so the call may
// return only after the opener has run: an ordering check, not a timing one.
TEST(CudaDevice, SyncEachOpWaitsForEveryOp) {
  ZO_REQUIRE_GPU();
  ::setenv("ZO_SYNC_EACH_OP", "1", 1);
  const auto dev = cuda_device(DType::kF32);
  ::unsetenv("ZO_SYNC_EACH_OP");
  const auto s = dev->create_stream();
  Buffer a = dev->alloc(64 * 64 * 4, "a"), out = dev->alloc(64 * 64 * 4, "out");
  dev->fill_zero(a.data(), a.bytes(), *s);
  s->synchronize();

  std::atomic<bool> gate_open{false};
  auto hold = [](void* gate) {
    while (!static_cast<std::atomic<bool>*>(gate)->load())
      std::this_thread::yield();
  };
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(s->native_handle()), hold, &gate_open),
            cudaSuccess);
  std::atomic<bool> opener_ran{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    opener_ran = true;
    gate_open = true;
  });
  dev->matmul_forward(out.data(), a.data(), a.data(), nullptr, {64, 64, 64}, *s);
  const bool returned_after_opening = opener_ran.load();
  opener.join();
  s->synchronize();
  EXPECT_TRUE(returned_after_opening) << "the call returned before the GEMM had run";
}

// Ops that need temporary memory take their stream's persistent scratch and the caching allocator
// reuses freed blocks: a second identical step of the model (forward, backward, gradient norm)
// makes no device allocation at all.
TEST(CudaDevice, StepsInSteadyStateAllocateNothing) {
  ZO_REQUIRE_GPU();
  if (zo::simt::device_allocations == nullptr) GTEST_SKIP() << "counts the emulator's allocations";
  const zo::model::ModelSpec spec = zo::model::model_spec_from_json(
      {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 37}, {"block_size", 8}},
      "steady");
  const zo::model::ParameterLayout layout(spec);
  const int B = 2, T = 7;
  const auto dev = cuda_device(DType::kBF16);
  const auto s = dev->create_stream();
  Buffer params = dev->alloc(layout.size() * 2, "p"), grads = dev->alloc(layout.size() * 2, "g");
  Buffer norm = dev->alloc(4, "norm");
  dev->fill_zero(params.data(), params.bytes(), *s);
  const std::vector<std::int32_t> tokens(B * T, 3);
  zo::model::Gpt gpt(*dev, layout, {B, T, false});
  auto step = [&] {
    gpt.set_batch(tokens, tokens, *s);
    gpt.forward(params.data(), T, true, 1.0f, *s);
    dev->fill_zero(grads.data(), grads.bytes(), *s);
    gpt.backward(params.data(), grads.data(), *s);
    dev->sum_squares(norm.as<float>(), grads.data(), layout.size(), *s);
    s->synchronize();
  };
  step();
  const std::uint64_t after_first = zo::simt::device_allocations();
  step();
  EXPECT_EQ(zo::simt::device_allocations(), after_first) << "the second step allocated";
}

TEST(CudaDevice, CapacityCachingAndOutOfMemory) {
  ZO_REQUIRE_GPU();
  constexpr std::size_t kCap = std::size_t{64} << 20;
  const auto dev = cuda_device(DType::kBF16, kCap);
  EXPECT_EQ(dev->capacity_bytes(), kCap);
  EXPECT_EQ(dev->used_bytes(), 0u);
  void* first = nullptr;
  {
    Buffer a = dev->alloc(1000, "a");
    first = a.data();
    EXPECT_NE(first, nullptr);
    EXPECT_GE(dev->used_bytes(), 1000u);
    EXPECT_LE(dev->used_bytes(), 1024u);
    Buffer z = dev->alloc(0, "zero bytes");
    EXPECT_NE(z.data(), nullptr);
    EXPECT_NE(z.data(), a.data());
  }
  EXPECT_EQ(dev->used_bytes(), 0u);
  {
    Buffer again = dev->alloc(1000, "again");
    EXPECT_EQ(again.data(), first) << "a freed block of the same size class is reused";
  }
  Buffer big = dev->alloc(40u << 20, "big");
  try {
    (void)dev->alloc(30u << 20, "too much");
    FAIL() << "allocating past the capacity must throw";
  } catch (const zo::OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 30u << 20);
    EXPECT_EQ(e.capacity(), kCap);
    EXPECT_EQ(e.in_use(), dev->used_bytes());
    EXPECT_TRUE(contains(e.what(), "too much")) << e.what();
  }
  big.reset();
  Buffer fits = dev->alloc(60u << 20, "fits after release");  // flushes the cached 40 MiB block
  EXPECT_NE(fits.data(), nullptr);
}

TEST(CudaDevice, CopiesFillAndOverlappingMove) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto s = dev->create_stream();
  std::vector<std::uint8_t> pattern(4099);
  std::iota(pattern.begin(), pattern.end(), std::uint8_t{1});
  Buffer a = dev->alloc(pattern.size(), "a"), b = dev->alloc(pattern.size(), "b");
  dev->copy_to_device(a.data(), pattern.data(), pattern.size(), *s);  // pageable host memory
  dev->copy_on_device(b.data(), a.data(), pattern.size(), *s);
  std::vector<std::uint8_t> expect = pattern;
  auto* bp = b.as<std::uint8_t>();
  dev->copy_on_device(bp + 3, bp, 4000, *s);  // overlapping, forward
  std::memmove(expect.data() + 3, expect.data(), 4000);
  dev->copy_on_device(bp + 10, bp + 50, 3000, *s);  // overlapping, backward
  std::memmove(expect.data() + 10, expect.data() + 50, 3000);
  dev->fill_zero(bp + 100, 77, *s);
  std::fill_n(expect.begin() + 100, 77, std::uint8_t{0});
  std::vector<std::uint8_t> got(pattern.size());
  dev->copy_to_host(got.data(), b.data(), got.size(), *s);
  s->synchronize();
  EXPECT_EQ(got, expect);
  std::vector<std::uint8_t> back(pattern.size());
  dev->copy_to_host(back.data(), a.data(), back.size(), *s);
  s->synchronize();
  EXPECT_EQ(back, pattern);
}

TEST(CudaDevice, EventsOrderStreamsAndTime) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto s1 = dev->create_stream(), s2 = dev->create_stream();
  const auto start = dev->create_event(), done = dev->create_event(), never = dev->create_event();
  EXPECT_TRUE(never->query());
  never->synchronize();
  EXPECT_THROW((void)done->elapsed_ms_since(*never), std::logic_error);

  constexpr std::size_t kBytes = std::size_t{64} << 20;
  Buffer a = dev->alloc(kBytes, "a"), b = dev->alloc(kBytes, "b");
  std::vector<std::uint8_t> host(kBytes, 0x5a);
  dev->record(*start, *s1);
  dev->copy_to_device(a.data(), host.data(), kBytes, *s1);
  dev->record(*done, *s1);
  dev->wait(*s2, *done);  // s2's copy must see s1's upload
  dev->copy_on_device(b.data(), a.data(), kBytes, *s2);
  std::vector<std::uint8_t> back(kBytes, 0);
  dev->copy_to_host(back.data(), b.data(), kBytes, *s2);
  s2->synchronize();
  EXPECT_TRUE(done->query());
  EXPECT_EQ(back, host);
  done->synchronize();
  const double ms = done->elapsed_ms_since(*start);
  EXPECT_GE(ms, 0.0);
  EXPECT_LT(ms, 60e3);
}

TEST(CudaDevice, RejectsForeignStreamsAndEvents) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto host = zo::dev::make_host_device({});
  const auto hs = host->create_stream();
  const auto he = host->create_event();
  const auto cs = dev->create_stream();
  Buffer x = dev->alloc(64, "x");
  EXPECT_THROW(dev->fill_zero(x.data(), 64, *hs), std::invalid_argument);
  EXPECT_THROW(dev->record(*he, *cs), std::invalid_argument);
  EXPECT_THROW(dev->gelu_forward(x.data(), x.data(), 8, *hs), std::invalid_argument);
}

// Two streams sharing the matmul workspace must not race: alternate GEMMs on both and compare.
TEST(CudaDevice, MatmulOnTwoStreamsMatchesOneStream) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto s1 = dev->create_stream(), s2 = dev->create_stream();
  const int N = 512, C = 256, OC = 768;
  std::mt19937 rng(3);
  auto upload = [&](std::size_t n) {
    const auto bytes = encode(normal_values(rng, n), DType::kBF16);
    Buffer b = dev->alloc(bytes.size(), "x");
    dev->copy_to_device(b.data(), bytes.data(), bytes.size(), *s1);
    s1->synchronize();
    return b;
  };
  Buffer inp = upload(std::size_t(N) * C), w = upload(std::size_t(OC) * C), bias = upload(OC);
  std::vector<Buffer> outs;
  for (int k = 0; k < 8; ++k) {
    outs.push_back(dev->alloc(std::size_t(N) * OC * 2, "out"));
    dev->matmul_forward(outs.back().data(), inp.data(), w.data(), bias.data(), {N, C, OC},
                        k % 2 == 0 ? *s1 : *s2);
  }
  s1->synchronize();
  s2->synchronize();
  std::vector<std::uint8_t> first(std::size_t(N) * OC * 2), other(first.size());
  dev->copy_to_host(first.data(), outs[0].data(), first.size(), *s1);
  s1->synchronize();
  for (std::size_t k = 1; k < outs.size(); ++k) {
    dev->copy_to_host(other.data(), outs[k].data(), other.size(), *s1);
    s1->synchronize();
    EXPECT_EQ(other, first) << "output " << k;
  }
}

// The launcher level: plans are created once per (shape, dtype, op, alignment).
TEST(CudaMatmul, PlansAreCachedPerShapeAndAlignment) {
  ZO_REQUIRE_GPU();
  zo::gpu::require_device(usable_device());
  const MatmulContextPtr owner(zo::gpu::create_matmul_context());
  zo::gpu::MatmulContext* ctx = owner.get();
  // OC * 4 bytes is a multiple of 32, so the output's alignment is set by its address alone.
  const int N = 26, C = 48, OC = 40;
  zo::test::GpuBuffer out(std::size_t(N) * OC * 4 + 16), inp(std::size_t(N) * C * 4 + 16),
      w(std::size_t(OC) * C * 4 + 16);
  std::vector<float> ones(std::size_t(OC) * C + 4, 0.5f);
  inp.copy_from_host(ones.data(), std::size_t(N) * C * 4);
  w.copy_from_host(ones.data(), std::size_t(OC) * C * 4);
  for (int k = 0; k < 3; ++k) {
    zo::gpu::launch_matmul_forward(ctx, out.data(), inp.data(), w.data(), nullptr, N, C, OC, 0,
                                   DType::kF32, nullptr);
  }
  EXPECT_EQ(zo::gpu::matmul_plan_count(ctx), 1u);
  zo::gpu::launch_matmul_forward(ctx, out.as<float>() + 1, inp.data(), w.data(), nullptr, N, C, OC,
                                 0, DType::kF32, nullptr);
  EXPECT_EQ(zo::gpu::matmul_plan_count(ctx), 2u) << "a 4-byte aligned output needs its own plan";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> host(std::size_t(N) * OC);
  out.copy_to_host(host.data(), host.size() * 4);
  EXPECT_FLOAT_EQ(host[0], 48 * 0.25f);
  EXPECT_THROW(zo::gpu::launch_matmul_forward(ctx, out.data(), inp.data(), w.data(), nullptr, 0, C,
                                              OC, 0, DType::kF32, nullptr),
               std::invalid_argument);
}

// GPT-2's vocabulary (50257) is not a multiple of 8, and cuBLASLt has only align-1 kernels for
// such a width: every matmul op runs an unaligned OC as an aligned GEMM of OC rounded down to 8
// and one of the tail. Checked here against float64 sums; the op cases with OC 37, 101 (padded
// rows), 150 and 45 check every op against the host backend.
TEST(CudaMatmul, UnalignedWidthRunsAsAnAlignedGemmAndATail) {
  ZO_REQUIRE_GPU();
  zo::gpu::require_device(usable_device());
  const MatmulContextPtr owner(zo::gpu::create_matmul_context());
  zo::gpu::MatmulContext* ctx = owner.get();
  const int N = 26, C = 48, OC = 37, ld = 40;
  std::mt19937 rng(5);
  const std::vector<float> inp = normal_values(rng, std::size_t(N) * C),
                           w = normal_values(rng, std::size_t(OC) * C),
                           bias = normal_values(rng, std::size_t(OC)),
                           dout = normal_values(rng, std::size_t(N) * ld);
  auto upload = [](const std::vector<float>& x) {
    auto b = std::make_unique<zo::test::GpuBuffer>(x.size() * 4);
    b->copy_from_host(x.data(), x.size() * 4);
    return b;
  };
  const auto d_inp = upload(inp), d_w = upload(w), d_bias = upload(bias), d_dout = upload(dout);
  const auto out = upload(std::vector<float>(std::size_t(N) * ld, 0.0f)),
             dinp = upload(std::vector<float>(std::size_t(N) * C, 0.0f)),
             dw = upload(std::vector<float>(std::size_t(OC) * C, 0.0f)),
             dbias = upload(std::vector<float>(std::size_t(OC), 0.0f));
  zo::gpu::launch_matmul_forward(ctx, out->data(), d_inp->data(), d_w->data(), d_bias->data(), N, C,
                                 OC, ld, DType::kF32, nullptr);
  zo::gpu::launch_matmul_backward(ctx, dinp->data(), dw->data(), dbias->data(), d_dout->data(),
                                  d_inp->data(), d_w->data(), N, C, OC, ld, DType::kF32, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<int> widths = zo::gpu::matmul_plan_widths(ctx);
  std::sort(widths.begin(), widths.end());
  widths.erase(std::unique(widths.begin(), widths.end()), widths.end());
  EXPECT_EQ(widths, (std::vector<int>{5, 32})) << "OC 37 runs as 32 aligned columns and 5";

  auto download = [](const zo::test::GpuBuffer& b) {
    std::vector<float> x(b.size() / 4);
    b.copy_to_host(x.data(), b.size());
    return x;
  };
  const std::vector<float> h_out = download(*out), h_dinp = download(*dinp), h_dw = download(*dw),
                           h_dbias = download(*dbias);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double ref = bias[o];
      for (int c = 0; c < C; ++c)
        ref += double(inp[n * C + c]) * w[o * C + c];
      ASSERT_NEAR(h_out[std::size_t(n) * ld + o], ref, 1e-4 * (1 + std::abs(ref))) << n << "," << o;
    }
    for (int c = 0; c < C; ++c) {
      double ref = 0;
      for (int o = 0; o < OC; ++o)
        ref += double(dout[n * ld + o]) * w[o * C + c];
      ASSERT_NEAR(h_dinp[std::size_t(n) * C + c], ref, 1e-4 * (1 + std::abs(ref))) << n << "," << c;
    }
  }
  for (int o = 0; o < OC; ++o) {
    double db = 0;
    for (int n = 0; n < N; ++n)
      db += dout[n * ld + o];
    ASSERT_NEAR(h_dbias[o], db, 1e-4 * (1 + std::abs(db))) << o;
    for (int c = 0; c < C; ++c) {
      double ref = 0;
      for (int n = 0; n < N; ++n)
        ref += double(dout[n * ld + o]) * inp[n * C + c];
      ASSERT_NEAR(h_dw[std::size_t(o) * C + c], ref, 1e-4 * (1 + std::abs(ref))) << o << "," << c;
    }
  }
}

// ---- epilogue fallbacks and the timed choice of algorithm
// ----------------------------------------

// Runs the op cases whose names start with "Matmul" against the host backend, each on a new device
// (a new plan cache); with_bias_chunks: also the bias-gradient shapes (C = 5), which only test the
// fallback's column-sum kernel.
void run_matmul_cases(DType t, bool with_bias_chunks) {
  const auto host = zo::dev::make_host_device({});
  for (const zo::test::OpCase& c : zo::test::op_cases()) {
    if (c.name.rfind("Matmul", 0) != 0) continue;
    if (!with_bias_chunks && contains(c.name, "_C5_")) continue;
    SCOPED_TRACE(c.name);
    const auto gpu = cuda_device(t);
    zo::test::run_op_case(c, t, *gpu, *host, zo::test::Compare::kTolerance);
  }
}

// Without any epilogue (cuBLASLt has none for some shapes and alignments), every matmul op takes
// its fallback kernels: the broadcast bias under an accumulating GEMM, the GELU kernel, the GELU
// gradient in place and the bias-gradient column sums.
TEST(CudaMatmul, FallbacksWithoutEpiloguesMatchHost) {
  ZO_REQUIRE_GPU();
  if (zo::simt::cublaslt_refuse_epilogues == nullptr) {
    GTEST_SKIP() << "needs the SIMT emulator's cuBLASLt, whose heuristic can refuse epilogues";
  }
  struct Refuse {
    Refuse() { zo::simt::cublaslt_refuse_epilogues(true); }
    ~Refuse() { zo::simt::cublaslt_refuse_epilogues(false); }
  } refuse;
  run_matmul_cases(DType::kBF16, true);
}

// Several candidates: the first call of each plan key times them on the stream (an accumulating
// GEMM into scratch) and keeps the fastest. Results must be those of one candidate: on a GPU
// against the host backend; on the emulator, whose candidates compute the same bits, bit for bit.
TEST(CudaMatmul, TimedChoiceKeepsEveryResult) {
  ZO_REQUIRE_GPU();
  const bool emulated = zo::simt::cublaslt_offer_algorithms != nullptr;
  struct Offer {
    bool on;
    explicit Offer(bool o) : on(o) {
      if (on) zo::simt::cublaslt_offer_algorithms(3);
    }
    ~Offer() {
      if (on) zo::simt::cublaslt_offer_algorithms(1);
    }
  };
  {
    const Offer offer(emulated);
    run_matmul_cases(DType::kBF16, false);
  }

  if (!emulated) return;
  zo::gpu::require_device(usable_device());
  const int N = 26, C = 48, OC = 40;
  std::mt19937 rng(9);
  auto buffer = [&](std::size_t n) {
    const std::vector<float> x = normal_values(rng, n);
    auto b = std::make_unique<zo::test::GpuBuffer>(n * 4);
    b->copy_from_host(x.data(), n * 4);
    return b;
  };
  const auto inp = buffer(std::size_t(N) * C), w = buffer(std::size_t(OC) * C), bias = buffer(OC),
             dout = buffer(std::size_t(N) * OC), pre = buffer(std::size_t(N) * C);
  // Every matmul op once, the backward twice (accumulating): the outputs, plans made and timed.
  struct Result {
    std::vector<float> values;
    std::size_t plans, timed;
  };
  auto run = [&](int candidates) {
    zo::simt::cublaslt_offer_algorithms(candidates);
    const MatmulContextPtr ctx(zo::gpu::create_matmul_context());
    const std::size_t no = std::size_t(N) * OC, nc = std::size_t(N) * C;
    std::vector<std::unique_ptr<zo::test::GpuBuffer>> outs;
    for (const std::size_t n : {no, no, no, nc, nc, std::size_t(OC) * C, std::size_t(OC)}) {
      outs.push_back(std::make_unique<zo::test::GpuBuffer>(n * 4));
      const std::vector<float> zeros(n, 0.0f);
      outs.back()->copy_from_host(zeros.data(), n * 4);
    }
    auto o = [&](int i) { return outs[std::size_t(i)]->data(); };
    zo::gpu::launch_matmul_forward(ctx.get(), o(0), inp->data(), w->data(), bias->data(), N, C, OC,
                                   0, DType::kF32, nullptr);
    zo::gpu::launch_matmul_gelu_forward(ctx.get(), o(1), o(2), inp->data(), w->data(), bias->data(),
                                        N, C, OC, DType::kF32, nullptr);
    for (int k = 0; k < 2; ++k) {
      zo::gpu::launch_matmul_backward(ctx.get(), o(3), o(5), o(6), dout->data(), inp->data(),
                                      w->data(), N, C, OC, 0, DType::kF32, nullptr);
    }
    zo::gpu::launch_matmul_dgelu_backward(ctx.get(), o(4), o(5), o(6), dout->data(), inp->data(),
                                          w->data(), pre->data(), N, C, OC, DType::kF32, nullptr);
    Result r{
        {}, zo::gpu::matmul_plan_count(ctx.get()), zo::gpu::matmul_timed_plan_count(ctx.get())};
    for (const auto& b : outs) {
      std::vector<float> host(b->size() / 4);
      b->copy_to_host(host.data(), b->size());
      r.values.insert(r.values.end(), host.begin(), host.end());
    }
    zo::simt::cublaslt_offer_algorithms(1);
    return r;
  };
  const Result one = run(1), several = run(3);
  EXPECT_EQ(one.timed, 0u) << "one candidate is taken without timing";
  EXPECT_EQ(several.plans, one.plans);
  EXPECT_EQ(several.timed, several.plans) << "every plan with several candidates is timed";
  ASSERT_EQ(several.values.size(), one.values.size());
  EXPECT_EQ(std::memcmp(several.values.data(), one.values.data(), one.values.size() * 4), 0)
      << "timing changed a result";
}

}  // namespace

// A resumed run makes the uninterrupted run's GEMM choices: exported from one context and imported
// into another, every timed plan takes the recorded candidate without timing. On the emulator the
// first context's timing is steered to candidate 2 and the second's to candidate 0, so only the
// import can make them agree; on a GPU, cuBLASLt's own algorithms make the round trip.
TEST(CudaMatmul, ExportedChoicesAreTakenWithoutTiming) {
  ZO_REQUIRE_GPU();
  zo::gpu::require_device(usable_device());
  const bool emulated = zo::simt::cublaslt_make_fastest != nullptr;
  struct Hooks {
    bool on;
    explicit Hooks(bool o) : on(o) {
      if (on) zo::simt::cublaslt_offer_algorithms(3);
    }
    ~Hooks() {
      if (on) {
        zo::simt::cublaslt_offer_algorithms(1);
        zo::simt::cublaslt_make_fastest(-1);
      }
    }
  } hooks(emulated);
  const int N = 256, C = 128, OC = 192;
  std::mt19937 rng(11);
  auto buffer = [&](std::size_t n) {
    const std::vector<float> x = normal_values(rng, n);
    std::vector<std::uint16_t> h(n);
    for (std::size_t i = 0; i < n; ++i)
      h[i] = zo::f32_to_bf16_bits(x[i]);
    auto b = std::make_unique<zo::test::GpuBuffer>(n * 2);
    b->copy_from_host(h.data(), n * 2);
    return b;
  };
  const auto inp = buffer(std::size_t(N) * C), w = buffer(std::size_t(OC) * C), bias = buffer(OC),
             dout = buffer(std::size_t(N) * OC), pre = buffer(std::size_t(N) * C),
             out = buffer(std::size_t(N) * OC), pre_out = buffer(std::size_t(N) * OC),
             dinp = buffer(std::size_t(N) * C), dw = buffer(std::size_t(OC) * C),
             dbias = buffer(OC);
  auto run_ops = [&](zo::gpu::MatmulContext* ctx) {
    const DType t = DType::kBF16;
    zo::gpu::launch_matmul_forward(ctx, out->data(), inp->data(), w->data(), bias->data(), N, C, OC,
                                   0, t, nullptr);
    zo::gpu::launch_matmul_gelu_forward(ctx, out->data(), pre_out->data(), inp->data(), w->data(),
                                        bias->data(), N, C, OC, t, nullptr);
    zo::gpu::launch_matmul_backward(ctx, dinp->data(), dw->data(), dbias->data(), dout->data(),
                                    inp->data(), w->data(), N, C, OC, 0, t, nullptr);
    zo::gpu::launch_matmul_dgelu_backward(ctx, dinp->data(), dw->data(), dbias->data(),
                                          dout->data(), inp->data(), w->data(), pre->data(), N, C,
                                          OC, t, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };

  if (emulated) zo::simt::cublaslt_make_fastest(2);
  const MatmulContextPtr first(zo::gpu::create_matmul_context());
  run_ops(first.get());
  const std::string choices = zo::gpu::export_matmul_choices(first.get());
  const std::size_t timed = zo::gpu::matmul_timed_plan_count(first.get());
  if (timed == 0)
    GTEST_SKIP() << "cuBLASLt offered one algorithm for every GEMM here: nothing timed";
  EXPECT_FALSE(choices.empty());

  if (emulated) zo::simt::cublaslt_make_fastest(0);
  const MatmulContextPtr second(zo::gpu::create_matmul_context());
  EXPECT_EQ(zo::gpu::import_matmul_choices(second.get(), choices), "");
  run_ops(second.get());
  EXPECT_EQ(zo::gpu::matmul_restored_plan_count(second.get()), timed);
  EXPECT_EQ(zo::gpu::matmul_timed_plan_count(second.get()), 0u) << "a restored plan is not timed";
  EXPECT_EQ(zo::gpu::export_matmul_choices(second.get()), choices) << "the same algorithms";
  if (emulated) {
    const MatmulContextPtr third(zo::gpu::create_matmul_context());
    run_ops(third.get());
    EXPECT_NE(zo::gpu::export_matmul_choices(third.get()), choices)
        << "without the import, timing picks candidate 0";
  }

  // Another GPU or library: nothing taken, and the reason says why; not an export: refused.
  const MatmulContextPtr other(zo::gpu::create_matmul_context());
  std::string foreign = choices;
  foreign.replace(foreign.find("; cublasLt "), 11, "; cublasLt 1");
  const std::string reason = zo::gpu::import_matmul_choices(other.get(), foreign);
  EXPECT_NE(reason.find("recorded as"), std::string::npos) << reason;
  EXPECT_THROW(zo::gpu::import_matmul_choices(other.get(), "not a choices file\n"),
               std::invalid_argument);
  std::string broken = choices;
  broken.insert(broken.find('\n') + 1, "1 2 3\n");
  EXPECT_THROW(zo::gpu::import_matmul_choices(other.get(), broken), std::invalid_argument);
}
