// The CUDA backend's kernels and launchers (gpu/src/*.cu, compiled as C++) run by the SIMT emulator
// (tests/simt/simt.h) against the host backend (DESIGN.md §8), so CI executes every kernel
// without a GPU: random data, odd sizes, aligned and unaligned operands (both the vector and the
// scalar paths), backward ops with += onto random gradients, each dtype. The first tests show that
// the emulator itself reports what the hardware would get wrong. test_cuda_ops runs the same
// comparisons on a real GPU.
#include <gtest/gtest.h>

// clang-format off
#include "prelude.h"  // first: the device vocabulary for the kernels defined below
// clang-format on

#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "block_reduce.cuh"
#include "core/dtype.h"
#include "cpu_adam/cpu_adam.h"
#include "device/host_ops.h"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "matmul_bias.h"
#include "op_compare.h"
#include "simt.h"

namespace {

using zo::DType;
using zo::simt::SimtError;
using zo::test::act_tol;
using zo::test::contains;
using zo::test::decode;
using zo::test::dtype_param_name;
using zo::test::encode;
using zo::test::expect_close;
using zo::test::kStatsTol;
using zo::test::round_to;
using zo::test::Tol;

// Runs `f`, expecting a SimtError whose message contains `part`.
template <typename F>
void expect_simt_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no SimtError; expected one mentioning \"" << part << "\"";
  } catch (const SimtError& e) {
    EXPECT_TRUE(contains(e.what(), part)) << e.what();
  }
}

// ---- the emulator itself ---------------------------------------------------------------------

__global__ void block_sum_kernel(double* out, const double* in, int n) {
  __shared__ double shared[32];
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  double v = i < n ? in[i] : 0.0;
  v = zo::gpu::block_sum(v, shared);
  // A second round through the same shared array: every thread holds the total, so summing
  // total / blockDim.x (a power of two: exact) gives the total back.
  v = zo::gpu::block_sum(v / blockDim.x, shared);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

TEST(SimtEmulator, BlockSumsOverBarriersAndShuffles) {
  const int threads = 256, blocks = 3, n = 700;  // the last block is partly past n
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> in(n), out(blocks, -1.0);
  for (double& v : in)
    v = uniform(rng);
  const zo::simt::Stats before = zo::simt::stats();
  ZO_LAUNCH(blocks, threads, 0, nullptr, block_sum_kernel)(out.data(), in.data(), n);
  const zo::simt::Stats after = zo::simt::stats();
  for (int b = 0; b < blocks; ++b) {
    double want = 0.0;
    for (int i = b * threads; i < std::min(n, (b + 1) * threads); ++i)
      want += in[i];
    EXPECT_NEAR(out[b], want, 1e-12) << "block " << b;
  }
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.threads - before.threads, std::uint64_t{blocks} * threads);
  // Per block: 2 block_sum calls x 2 __syncthreads; 8 warps x 2 calls x 2 warp_sums x 5 shuffles.
  EXPECT_EQ(after.block_barriers - before.block_barriers, std::uint64_t{blocks} * 4);
  EXPECT_EQ(after.warp_syncs - before.warp_syncs, std::uint64_t{blocks} * 8 * 2 * 2 * 5);
}

__global__ void shuffle_kernel(int* out, int lane_mask, int width) {
  const int me = static_cast<int>(threadIdx.x);
  out[me] = __shfl_xor_sync(0xffffffffu, me * 10 + 3, lane_mask, width);
}

TEST(SimtEmulator, ShuffleXorReadsThePartnerLane) {
  for (int width : {32, 8}) {
    for (int lane_mask = 1; lane_mask < 32; ++lane_mask) {
      std::vector<int> out(64, -1);
      ZO_LAUNCH(1, 64, 0, nullptr, shuffle_kernel)(out.data(), lane_mask, width);
      for (int t = 0; t < 64; ++t) {
        const int lane = t % 32;
        int src = lane ^ lane_mask;
        if (src >= (lane / width + 1) * width) src = lane;  // later group: own value (CUDA)
        ASSERT_EQ(out[t], (t - lane + src) * 10 + 3)
            << "thread " << t << " mask " << lane_mask << " width " << width;
      }
    }
  }
}

__global__ void divergent_sync_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void shuffle_beside_sync_kernel(int* out) {
  // Lane 0 shuffles with the whole warp while the other lanes wait at a block barrier.
  if (threadIdx.x == 0) {
    out[0] = __shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    __syncthreads();
  }
}

__global__ void partial_warp_shuffle_kernel(float* out) {
  // The block's second warp has only 16 lanes; a full mask names 16 lanes that do not exist.
  out[threadIdx.x] = zo::gpu::warp_sum(1.0f);
}

TEST(SimtEmulator, ReportsDivergentBarriersAndBadShuffleMasks) {
  std::vector<int> ints(64, 0);
  std::vector<float> floats(64, 0.0f);
  expect_simt_error(
      [&] {
        ZO_LAUNCH(1, 64, 0, nullptr, divergent_sync_kernel)
        (ints.data());
      },
      "__syncthreads() reached at");
  expect_simt_error(
      [&] {
        ZO_LAUNCH(1, 64, 0, nullptr, shuffle_beside_sync_kernel)
        (ints.data());
      },
      "deadlock");
  expect_simt_error(
      [&] {
        ZO_LAUNCH(1, 48, 0, nullptr, partial_warp_shuffle_kernel)
        (floats.data());
      },
      "does not exist");
  // With whole warps the same kernel is fine.
  ZO_LAUNCH(1, 64, 0, nullptr, partial_warp_shuffle_kernel)(floats.data());
  EXPECT_EQ(floats, std::vector<float>(64, 32.0f));
}

__global__ void shared_memory_kernel(float* out, int writers) {
  ZO_DYNAMIC_SHARED(float, smem);
  if (static_cast<int>(threadIdx.x) < writers) smem[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = smem[blockDim.x - 1 - threadIdx.x];
}

TEST(SimtEmulator, ChecksLaunchLimitsAndPoisonsSharedMemory) {
  std::vector<float> out(128, 0.0f);
  expect_simt_error(
      [&] {
        ZO_LAUNCH(1, 1025, 0, nullptr, shared_memory_kernel)
        (out.data(), 0);
      },
      "block too large");
  expect_simt_error(
      [&] {
        ZO_LAUNCH(0, 32, 0, nullptr, shared_memory_kernel)
        (out.data(), 0);
      },
      "empty grid");
  const std::size_t big = 64 * 1024;
  expect_simt_error(
      [&] {
        ZO_LAUNCH(1, 128, big, nullptr, shared_memory_kernel)
        (out.data(), 128);
      },
      "exceed the kernel's limit");
  ASSERT_EQ(cudaFuncSetAttribute(shared_memory_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(big)),
            cudaSuccess);
  ZO_LAUNCH(1, 128, big, nullptr, shared_memory_kernel)(out.data(), 128);
  for (int t = 0; t < 128; ++t)
    EXPECT_EQ(out[t], static_cast<float>(127 - t));
  // Only the first 100 threads write: the last 28 slots read as NaN, not as zeros.
  ZO_LAUNCH(1, 128, 512, nullptr, shared_memory_kernel)(out.data(), 100);
  for (int t = 0; t < 128; ++t)
    EXPECT_EQ(std::isnan(out[t]), 127 - t >= 100) << t;
}

// ---- the ops against the host backend --------------------------------------------------------

// A "device" tensor of the emulated GPU: host bytes in the storage dtype, `offset` elements into
// its allocation (offset 1 gives operands that are not 16-byte aligned: the scalar paths).
struct DevTensor {
  std::vector<std::uint8_t> bytes;
  std::size_t offset = 0;
  std::size_t n = 0;
  DType t = DType::kF32;

  void* p() { return bytes.data() + offset * zo::dtype_size(t); }
  float* f() { return static_cast<float*>(p()); }
  std::vector<float> get() const {
    const std::size_t es = zo::dtype_size(t);
    return decode({bytes.begin() + offset * es, bytes.begin() + (offset + n) * es}, t);
  }
};

DevTensor put(const std::vector<float>& x, DType t, std::size_t offset = 0) {
  DevTensor d;
  d.t = t;
  d.n = x.size();
  d.offset = offset;
  d.bytes.assign((x.size() + offset) * zo::dtype_size(t), 0xab);
  const std::vector<std::uint8_t> enc = encode(x, t);
  std::copy(enc.begin(), enc.end(), d.bytes.begin() + offset * zo::dtype_size(t));
  return d;
}

class SimtOps : public zo::test::DtypeOpTest {
 protected:
  DevTensor act(const std::vector<float>& x, std::size_t offset = 0) { return put(x, t(), offset); }

  tbb::task_arena arena_{1};
};

// Aligned operands, then operands one element off (the kernels' scalar paths).
constexpr std::size_t kOffsets[] = {0, 1};

TEST_P(SimtOps, EmbeddingForwardAndBackward) {
  const int B = 2, T = 13, V = 101;
  for (const int C : {48, 37}) {
    for (const std::size_t off : kOffsets) {
      SCOPED_TRACE("C=" + std::to_string(C) + " offset=" + std::to_string(off));
      const std::size_t BT = std::size_t(B) * T;
      auto tok = tokens(BT, V);
      tok[7] = tok[0];  // repeated tokens accumulate into one wte row
      tok[20] = tok[0];
      const auto wte = rand(std::size_t(V) * C), wpe = rand(std::size_t(T) * C);
      const auto dout = rand(BT * C);
      const auto dwte0 = rand(std::size_t(V) * C), dwpe0 = rand(std::size_t(T) * C);

      std::vector<float> out_h(BT * C), dwte_h = dwte0, dwpe_h = dwpe0;
      zo::dev::host::embedding_forward(arena_, out_h.data(), tok.data(), wte.data(), wpe.data(), B,
                                       T, C);
      zo::dev::host::embedding_backward(arena_, dwte_h.data(), dwpe_h.data(), dout.data(),
                                        tok.data(), B, T, C);

      DevTensor e = act(wte, off), p = act(wpe, off), out = act(rand(BT * C), off);
      DevTensor dy = act(dout, off), de = act(dwte0, off), dp = act(dwpe0, off);
      zo::gpu::launch_embedding_forward(out.p(), tok.data(), e.p(), p.p(), B, T, C, t(), nullptr);
      zo::gpu::launch_embedding_backward(de.p(), dp.p(), dy.p(), tok.data(), B, T, C, t(), nullptr);
      expect_close(out.get(), out_h, tol(), "embedding out");
      expect_close(de.get(), dwte_h, tol(), "dwte");
      expect_close(dp.get(), dwpe_h, tol(), "dwpe");
    }
  }
}

TEST_P(SimtOps, LayerNormForwardAndBackward) {
  const int N = 26;
  for (const int C : {48, 37}) {
    for (const std::size_t off : kOffsets) {
      SCOPED_TRACE("C=" + std::to_string(C) + " offset=" + std::to_string(off));
      const std::size_t NC = std::size_t(N) * C;
      const auto inp = rand(NC, 2.0f, 0.5f), weight = rand(C, 0.5f, 1.0f), bias = rand(C, 0.5f);
      const auto dout = rand(NC), dinp0 = rand(NC), dw0 = rand(C), db0 = rand(C);

      std::vector<float> out_h(NC), mean_h(N), rstd_h(N), dinp_h = dinp0, dw_h = dw0, db_h = db0;
      zo::dev::host::layernorm_forward(arena_, out_h.data(), mean_h.data(), rstd_h.data(),
                                       inp.data(), weight.data(), bias.data(), N, C);
      zo::dev::host::layernorm_backward(arena_, dinp_h.data(), dw_h.data(), db_h.data(),
                                        dout.data(), inp.data(), weight.data(), mean_h.data(),
                                        rstd_h.data(), N, C);

      DevTensor x = act(inp, off), w = act(weight, off), b = act(bias, off);
      DevTensor out = act(rand(NC), off);
      std::vector<float> mean(N, -1.0f), rstd(N, -1.0f);
      zo::gpu::launch_layernorm_forward(out.p(), mean.data(), rstd.data(), x.p(), w.p(), b.p(), N,
                                        C, t(), nullptr);
      expect_close(out.get(), out_h, tol(), "layernorm out");
      expect_close(mean, mean_h, kStatsTol, "mean");
      expect_close(rstd, rstd_h, kStatsTol, "rstd");

      // The backward reads the host's statistics, so both sides see the same inputs.
      DevTensor dy = act(dout, off), dx = act(dinp0, off), dw = act(dw0, off), db = act(db0, off);
      zo::gpu::launch_layernorm_backward(dx.p(), dw.p(), db.p(), dy.p(), x.p(), w.p(),
                                         mean_h.data(), rstd_h.data(), N, C, t(), nullptr);
      expect_close(dx.get(), dinp_h, tol(), "layernorm dinp");
      expect_close(dw.get(), dw_h, tol(), "layernorm dweight");
      expect_close(db.get(), db_h, tol(), "layernorm dbias");
    }
  }
}

TEST_P(SimtOps, GeluResidualAccumulate) {
  const std::size_t n = 1251;  // not a multiple of any vector width
  for (const std::size_t off : kOffsets) {
    SCOPED_TRACE("offset=" + std::to_string(off));
    const auto x = rand(n, 2.0f), y = rand(n), dout = rand(n), dinp0 = rand(n);
    std::vector<float> gelu_h(n), dgelu_h = dinp0, residual_h(n), acc_h = y;
    zo::dev::host::gelu_forward(arena_, gelu_h.data(), x.data(), n);
    zo::dev::host::gelu_backward(arena_, dgelu_h.data(), x.data(), dout.data(), n);
    zo::dev::host::residual_forward(arena_, residual_h.data(), x.data(), y.data(), n);
    zo::dev::host::accumulate(arena_, acc_h.data(), dout.data(), n);

    DevTensor a = act(x, off), b = act(y, off), dy = act(dout, off), dx = act(dinp0, off);
    DevTensor out = act(rand(n), off);
    zo::gpu::launch_gelu_forward(out.p(), a.p(), n, t(), nullptr);
    expect_close(out.get(), gelu_h, tol(), "gelu");
    zo::gpu::launch_gelu_backward(dx.p(), a.p(), dy.p(), n, t(), nullptr);
    expect_close(dx.get(), dgelu_h, tol(), "gelu dinp");
    zo::gpu::launch_residual_forward(out.p(), a.p(), b.p(), n, t(), nullptr);
    expect_close(out.get(), residual_h, tol(), "residual");
    zo::gpu::launch_accumulate(b.p(), dy.p(), n, t(), nullptr);
    expect_close(b.get(), acc_h, tol(), "accumulate");
  }
}

TEST_P(SimtOps, AttentionForwardAndBackward) {
  struct Shape {
    int B, T, C, NH;
  };
  // hs 16 with odd T; GPT-2's hs 64 past one 64-row tile; hs 100 (32-row tiles, two chunks);
  // hs 10 (not a multiple of 4: the scalar loads); a single token.
  const Shape shapes[] = {
      {2, 13, 48, 3}, {1, 77, 128, 2}, {1, 40, 200, 2}, {2, 9, 30, 3}, {1, 1, 16, 1}};
  for (const Shape sh : shapes) {
    SCOPED_TRACE("B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) +
                 " C=" + std::to_string(sh.C) + " NH=" + std::to_string(sh.NH));
    const std::size_t BT = std::size_t(sh.B) * sh.T, C = sh.C;
    const std::size_t rows = std::size_t(sh.B) * sh.NH * sh.T;
    const auto qkv = rand(BT * 3 * C), dout = rand(BT * C), dqkv0 = rand(BT * 3 * C);

    std::vector<float> out_h(BT * C), lse_h(rows);
    zo::dev::host::attention_forward(arena_, out_h.data(), lse_h.data(), qkv.data(), sh.B, sh.T,
                                     sh.C, sh.NH);
    // The backward reads the host forward's out (in the dtype under test) and lse on both sides.
    const std::vector<float> out_in = round_to(out_h, t());
    std::vector<float> dqkv_h = dqkv0;
    zo::dev::host::attention_backward(arena_, dqkv_h.data(), dout.data(), qkv.data(), out_in.data(),
                                      lse_h.data(), sh.B, sh.T, sh.C, sh.NH);

    DevTensor x = act(qkv), out = act(rand(BT * C));
    std::vector<float> lse(rows, -7.0f), scratch(rows, std::nanf(""));
    zo::gpu::launch_attention_forward(out.p(), lse.data(), x.p(), sh.B, sh.T, sh.C, sh.NH, t(),
                                      nullptr);
    expect_close(out.get(), out_h, tol(), "attention out");
    expect_close(lse, lse_h, kStatsTol, "lse");

    DevTensor o_in = act(out_in), dy = act(dout), dx = act(dqkv0);
    zo::gpu::launch_attention_backward(dx.p(), dy.p(), x.p(), o_in.p(), lse_h.data(),
                                       scratch.data(), sh.B, sh.T, sh.C, sh.NH, t(), nullptr);
    expect_close(dx.get(), dqkv_h, tol(), "dqkv");
  }
}

TEST_P(SimtOps, CrossEntropyWithSeparateAliasedAndNoGradient) {
  struct Shape {
    int N, V;
  };
  for (const Shape sh : {Shape{26, 101}, Shape{5, 256}, Shape{3, 50257}}) {
    SCOPED_TRACE("N=" + std::to_string(sh.N) + " V=" + std::to_string(sh.V));
    const std::size_t NV = std::size_t(sh.N) * sh.V;
    const auto logits = rand(NV, 2.0f);
    const auto targets = tokens(std::size_t(sh.N), sh.V);
    const float scale = 1.0f / float(sh.N);
    std::vector<float> losses_h(sh.N), dlogits_h(NV);
    zo::dev::host::cross_entropy(arena_, losses_h.data(), dlogits_h.data(), logits.data(),
                                 targets.data(), sh.N, sh.V, scale);

    DevTensor x = act(logits), dx = act(rand(NV));
    std::vector<float> losses(sh.N, -1.0f);
    zo::gpu::launch_cross_entropy(losses.data(), nullptr, x.p(), targets.data(), sh.N, sh.V, scale,
                                  t(), nullptr);
    expect_close(losses, losses_h, kStatsTol, "losses (no dlogits)");
    EXPECT_EQ(x.get(), logits) << "a null dlogits must leave the logits alone";
    std::fill(losses.begin(), losses.end(), -1.0f);
    zo::gpu::launch_cross_entropy(losses.data(), dx.p(), x.p(), targets.data(), sh.N, sh.V, scale,
                                  t(), nullptr);
    expect_close(losses, losses_h, kStatsTol, "losses");
    expect_close(dx.get(), dlogits_h, tol(), "dlogits");
    std::fill(losses.begin(), losses.end(), -1.0f);
    zo::gpu::launch_cross_entropy(losses.data(), x.p(), x.p(), targets.data(), sh.N, sh.V, scale,
                                  t(), nullptr);
    expect_close(losses, losses_h, kStatsTol, "losses (aliased)");
    expect_close(x.get(), dlogits_h, tol(), "dlogits (aliased)");
  }
}

TEST_P(SimtOps, SumSquaresAccumulatesDeterministically) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1251}, std::size_t{100003}}) {
    for (const std::size_t off : kOffsets) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(off));
      const auto x = rand(n);
      float want = 1.5f;
      zo::dev::host::sum_squares(arena_, &want, x.data(), n);
      DevTensor data = act(x, off);
      float got = 1.5f, again = 1.5f;
      zo::gpu::launch_sum_squares(&got, data.p(), n, t(), nullptr);
      zo::gpu::launch_sum_squares(&again, data.p(), n, t(), nullptr);
      EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << "sum of squares + 1.5";
      EXPECT_EQ(again, got) << "sum_squares must be bit-reproducible";
    }
  }
}

TEST_P(SimtOps, NonfiniteFlag) {
  const std::size_t n = 1001;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto finite = rand(n, 100.0f);
  for (const std::size_t off : kOffsets) {
    auto flag_after = [&](const std::vector<float>& x, float preset) {
      DevTensor data = act(x, off);
      float flag = preset;
      zo::gpu::launch_nonfinite_flag(&flag, data.p(), x.size(), t(), nullptr);
      return flag;
    };
    EXPECT_EQ(flag_after(finite, 0.0f), 0.0f);
    EXPECT_EQ(flag_after(finite, 0.25f), 0.25f) << "a finite tensor leaves the flag as it was";
    const std::pair<std::size_t, float> bad[] = {{0, -inf}, {777, inf}, {n - 1, nan}, {500, nan}};
    for (const auto& [index, value] : bad) {
      std::vector<float> x = finite;
      x[index] = value;
      EXPECT_EQ(flag_after(x, 0.0f), 1.0f) << value << " at " << index << " offset " << off;
    }
  }
}

TEST_P(SimtOps, CastMatchesHostConvertersBitForBit) {
  const std::vector<float> x = cast_inputs();
  const std::size_t n = x.size();
  for (const DType src_t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const std::size_t off : kOffsets) {
      SCOPED_TRACE(std::string(zo::dtype_name(src_t)) + " -> " + std::string(zo::dtype_name(t())) +
                   " offset " + std::to_string(off));
      const std::vector<float> src_values = round_to(x, src_t);
      DevTensor src = put(src_values, src_t, off);
      DevTensor dst = put(std::vector<float>(n, 0.0f), t(), off);
      zo::gpu::launch_cast(src.p(), src_t, dst.p(), t(), n, nullptr);
      std::vector<std::uint8_t> want(n * zo::dtype_size(t()));
      zo::dev::host::cast(arena_, want.data(), t(), src.p(), src_t, n);
      const std::size_t es = zo::dtype_size(t());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), dst.bytes.begin() + off * es));
    }
  }
}

TEST_P(SimtOps, AdamWMatchesCpuAdamOverTenSteps) {
  const std::size_t n = 1001;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> master0(n);
  for (float& v : master0)
    v = normal(rng_);
  std::vector<float> master = master0, m(n, 0.0f), v(n, 0.0f);
  std::vector<float> master_h = master0, m_h(n, 0.0f), v_h(n, 0.0f);
  DevTensor params = act(std::vector<float>(n, 0.0f), 1);
  zo::AdamConfig c;
  c.lr = 1e-2f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  const float grad_mult = 0.5f;
  const zo::cpu_adam::CpuAdam adam(c);
  for (std::int64_t k = 1; k <= 10; ++k) {
    std::vector<float> g = rand(n);  // representable in the dtype under test
    DevTensor gd = act(g);
    zo::gpu::launch_adamw(master.data(), m.data(), v.data(), gd.p(), t(), params.p(), t(), n, c, k,
                          grad_mult, nullptr);
    zo::cpu_adam::AdamBuffers b;
    b.params = {master_h.data(), n};
    b.exp_avg = {m_h.data(), n, DType::kF32};
    b.exp_avg_sq = {v_h.data(), n, DType::kF32};
    b.grads = {g.data(), n, DType::kF32};
    adam.update(b, k, {grad_mult, zo::cpu_adam::NonFinitePolicy::kReport});
  }
  expect_close(master, master_h, kStatsTol, "master");
  expect_close(m, m_h, kStatsTol, "m");
  expect_close(v, v_h, kStatsTol, "v");
  EXPECT_EQ(params.get(), round_to(master, t())) << "params_out is the new master, rounded";
}

TEST_P(SimtOps, BiasBroadcastAndGradientInChunks) {
  for (const int N : {1, 37, 1000}) {
    for (const int OC : {1, 96, 301}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " OC=" + std::to_string(OC));
      const auto bias = rand(OC), dout = rand(std::size_t(N) * OC), db0 = rand(OC);
      DevTensor b = act(bias), out = act(rand(std::size_t(N) * OC));
      zo::gpu::launch_bias_broadcast(out.p(), b.p(), N, OC, t(), nullptr);
      const std::vector<float> rows = out.get();
      for (int r = 0; r < N; ++r)
        ASSERT_TRUE(std::equal(bias.begin(), bias.end(), rows.begin() + std::size_t(r) * OC)) << r;

      // Column sums in float64 as the reference; scratch room for none, a few and many chunks.
      std::vector<float> want(OC);
      for (int c = 0; c < OC; ++c) {
        double s = db0[c];
        for (int r = 0; r < N; ++r)
          s += dout[std::size_t(r) * OC + c];
        want[c] = static_cast<float>(s);
      }
      std::vector<float> first;
      for (const std::size_t scratch_floats :
           {std::size_t{0}, std::size_t(OC) * 3, std::size_t(OC) * 64}) {
        DevTensor dy = act(dout), db = act(db0);
        std::vector<float> scratch(std::max<std::size_t>(scratch_floats, 1), std::nanf(""));
        zo::gpu::launch_bias_backward(db.p(), dy.p(), N, OC, t(),
                                      scratch_floats ? scratch.data() : nullptr,
                                      scratch_floats * sizeof(float), nullptr);
        expect_close(db.get(), want, tol(), "dbias, scratch " + std::to_string(scratch_floats));
      }
    }
  }
}

TEST(SimtLaunchers, BadArgumentsThrowBeforeAnyLaunch) {
  const zo::simt::Stats before = zo::simt::stats();
  float x = 1.0f;
  EXPECT_THROW(
      zo::gpu::launch_attention_forward(&x, &x, &x, 1, 4, 129 * 2, 2, DType::kF32, nullptr),
      std::invalid_argument);  // head size 129
  EXPECT_THROW(
      zo::gpu::launch_layernorm_forward(&x, &x, &x, &x, &x, nullptr, 1, 1, DType::kF32, nullptr),
      std::invalid_argument);
  EXPECT_THROW(zo::gpu::launch_cast(&x, static_cast<DType>(99), &x, DType::kF32, 1, nullptr),
               std::invalid_argument);
  EXPECT_EQ(zo::simt::stats().launches, before.launches);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SimtOps, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         dtype_param_name);

}  // namespace
