// The offload engine on the CUDA backend in bf16 and fp16, --grad-accum 3 summed on the device
// against summed on the host. Both add the same 16-bit micro-batch gradients in the same order
// in fp32 (the device's first micro-batch assigns, as the host's does), so the gradient CPU Adam
// reads when the device sums must be the host's fp32 sum rounded once to the act dtype, bit for
// bit; its norm is that of the rounded sum, within 2u relative (u = 2^-8 bf16, 2^-11 fp16, the
// unit roundoff of one rounding). An Inf in any one micro-batch must be reported either way.
// test_offload_cuda_simt runs this file on the SIMT emulator in CI; test_offload_cuda on a GPU
// (skips without one).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "device/cuda_device.h"
#include "engine_rig.h"
#include "gpu/device.h"
#include "gpu_test_device.h"
#include "model/gpt.h"
#include "model/layout.h"
#include "offload/engine.h"
#include "optim/host_optimizer.h"

namespace {

using zo::DType;
using zo::offload::Engine;
using zo::offload::EngineConfig;
using zo::test::Batches;

constexpr int kB = 1, kT = 16, kAccum = 3;

#define ZO_REQUIRE_GPU()                                                                        \
  do {                                                                                          \
    if (const std::string why = zo::gpu::no_device_reason(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

std::uint16_t round_to(float x, DType t) {
  return t == DType::kF16 ? zo::float_to_half(x) : zo::float_to_bf16(x);
}

// A CUDA device in dtype t, a model with odd sizes and an engine whose micro-batches are summed
// on the device or on the host; every rig starts from the same weights.
struct Rig {
  zo::model::ParameterLayout layout{zo::test::odd_spec()};
  std::unique_ptr<zo::dev::Device> d;
  std::unique_ptr<zo::dev::Stream> stream;
  std::unique_ptr<zo::optim::HostOptimizer> opt;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<zo::model::Gpt> gpt;

  // window > 0: stream mode with that many slots, released slots poisoned with NaN.
  Rig(DType t, bool on_device, int window = 0) {
    zo::dev::CudaDeviceOptions o;
    o.device = zo::test::usable_device();
    o.act_dtype = t;
    d = zo::dev::make_cuda_device(o);
    stream = d->create_stream();
    zo::optim::OptimizerConfig oc;
    oc.threads = 2;
    opt = std::make_unique<zo::optim::HostOptimizer>(layout, oc);
    zo::model::init_weights(layout, 21, opt->master().data());
    EngineConfig ec;
    ec.bucket_bytes = 4108;  // cuts tensors and blocks anywhere
    ec.grad_accum = kAccum;
    ec.host_slots = 2;
    ec.accumulate_on_device = on_device;
    ec.param_window = window;
    ec.poison_window = window > 0;
    engine = std::make_unique<Engine>(*d, *stream, layout, *opt, ec);
    engine->upload_all();
    gpt = std::make_unique<zo::model::Gpt>(*d, layout, zo::model::ModelShape{kB, kT, false});
  }
  // One step's gradients (no update: the next step reads the same weights).
  zo::offload::GradStats gradients(const Batches& b, zo::model::ParameterStore* store = nullptr) {
    return zo::test::engine_gradients(*stream, *engine, *gpt, b, kT, 1.0f / (kB * kT * kAccum),
                                      false, store);
  }
};

class CudaEngine : public ::testing::TestWithParam<DType> {};

// An engine destroyed mid-step (an error unwinding before finish_gradients) first waits for the
// compute stream, which still reads its parameters and writes its gradient slots: a host task
// holds the stream up so that the step is still queued when the engine goes. On the emulator a
// block handed back to the caching allocator while queued work uses it aborts, naming the work.
TEST_P(CudaEngine, DestroyedMidStepWaitsForTheComputeStream) {
  ZO_REQUIRE_GPU();
  Rig rig(GetParam(), true);
  const Batches b(1, kB * kT, 9);
  const auto sleep = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  ASSERT_EQ(
      cudaLaunchHostFunc(static_cast<cudaStream_t>(rig.stream->native_handle()), sleep, nullptr),
      cudaSuccess);
  rig.engine->begin_step(false);
  rig.gpt->set_batch(b.tokens[0], b.targets[0], *rig.stream);
  rig.gpt->forward(*rig.engine, kT, true, 1.0f, *rig.stream);
  rig.engine->begin_micro_batch(0);
  rig.gpt->backward(*rig.engine, *rig.stream);
  rig.engine.reset();
  rig.stream->synchronize();
}

// Stream mode (a window of 2 block slots; offload/param_window.h) trains like every parameter
// on the device, bit for bit: the losses of every micro-batch and the master weights, over steps
// whose updates overlap the next forward. The slots keep each group's alignment, so the GEMMs
// see the same pointers modulo 256 bytes in both modes.
TEST_P(CudaEngine, StreamModeTrainsLikeOffloadBitForBit) {
  ZO_REQUIRE_GPU();
  const auto train = [&](int window) {
    Rig rig(GetParam(), false, window);
    std::vector<float> seen;
    for (int step = 0; step < 3; ++step) {
      const Batches b(kAccum, kB * kT, 40 + step);
      rig.engine->begin_step(false);
      for (int k = 0; k < kAccum; ++k) {
        rig.gpt->set_batch(b.tokens[std::size_t(k)], b.targets[std::size_t(k)], *rig.stream);
        rig.gpt->forward(*rig.engine, kT, true, 1.0f / (kB * kT * kAccum), *rig.stream);
        rig.engine->begin_micro_batch(k);
        rig.gpt->backward(*rig.engine, *rig.stream);
        rig.stream->synchronize();
        const auto l = zo::test::download(*rig.d, rig.gpt->losses(), kB * kT);
        seen.insert(seen.end(), l.begin(), l.end());
      }
      EXPECT_FALSE(rig.engine->finish_gradients().nonfinite);
      rig.engine->start_update(3e-3f, 1.0f);
    }
    rig.engine->drain();
    seen.insert(seen.end(), rig.opt->master().begin(), rig.opt->master().end());
    return seen;
  };
  EXPECT_EQ(train(2), train(0));
}

TEST_P(CudaEngine, DeviceSumIsTheHostSumRoundedOnce) {
  ZO_REQUIRE_GPU();
  const DType t = GetParam();
  const double u = t == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  Rig host(t, false), device(t, true);
  const std::size_t n = host.layout.size();
  for (int step = 0; step < 2; ++step) {  // the second step's sum starts afresh
    const Batches b(kAccum, kB * kT, 70 + step);
    const auto sh = host.gradients(b), sd = device.gradients(b);
    EXPECT_FALSE(sh.nonfinite);
    EXPECT_FALSE(sd.nonfinite);
    EXPECT_NEAR(sd.sumsq, sh.sumsq, (2 * u + 1e-5) * sh.sumsq) << "step " << step;
    const auto gh = host.engine->host_grads(), gd = device.engine->host_grads();
    ASSERT_EQ(gh.dtype, DType::kF32);
    ASSERT_EQ(gd.dtype, t);
    ASSERT_EQ(gd.size, n);
    const auto* fp32_sum = static_cast<const float*>(gh.data);
    const auto* rounded = static_cast<const std::uint16_t*>(gd.data);
    std::size_t nonzero = 0, mismatches = 0, first = n;
    for (std::size_t i = 0; i < n; ++i) {
      nonzero += fp32_sum[i] != 0.0f;
      if (rounded[i] != round_to(fp32_sum[i], t)) {
        ++mismatches;
        first = std::min(first, i);
      }
    }
    EXPECT_EQ(mismatches, 0u) << "step " << step << ", first at " << first << ": "
                              << fp32_sum[first < n ? first : 0];
    EXPECT_GT(nonzero, n / 2) << "the gradients are not trivially zero";
  }
}

// An Inf in one element of the middle micro-batch skips the step wherever it is summed; the
// same step without it is clean.
TEST_P(CudaEngine, InfInOneMicroBatchIsReported) {
  ZO_REQUIRE_GPU();
  const DType t = GetParam();
  for (const bool on_device : {false, true}) {
    Rig rig(t, on_device);
    const std::size_t at = rig.layout.block(1).fc_w + 17;
    for (const int micro : {1, kAccum}) {  // kAccum: none
      zo::test::CorruptOneGradient store(*rig.engine, *rig.d, *rig.stream, at,
                                         zo::test::element_bytes(INFINITY, t), micro);
      const auto st = rig.gradients(Batches(kAccum, kB * kT, 9), &store);
      EXPECT_EQ(st.nonfinite, micro < kAccum) << "on device " << on_device << ", micro " << micro;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaEngine, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& test) { return std::string(zo::dtype_name(test.param)); });

// The one place the two differ: in fp16 a sum beyond 65504 of finite micro-batch gradients is
// an overflow when the device rounds it to fp16 (CPU Adam would read Inf), while the host's fp32
// sum holds it. The loss scale backs off, as in resident mode.
TEST(CudaEngineFp16, SumBeyondTheRangeIsAnOverflowOnlyWhenRoundedOnTheDevice) {
  ZO_REQUIRE_GPU();
  for (const bool on_device : {false, true}) {
    Rig rig(DType::kF16, on_device);
    zo::test::CorruptOneGradient store(*rig.engine, *rig.d, *rig.stream,
                                       rig.layout.block(2).qkv_w + 5,
                                       zo::test::element_bytes(40000.0f, DType::kF16), -1);
    EXPECT_EQ(rig.gradients(Batches(kAccum, kB * kT, 4), &store).nonfinite, on_device);
  }
}

}  // namespace
