// The SIMT emulator (tests/simt/simt.h) itself: that it runs kernels as a GPU would and reports
// what the hardware would get wrong; then what of gpu/'s launchers (compiled as C++) the Device
// interface cannot reach. Every op runs on the emulator in test_cuda_ops_simt.
#include <gtest/gtest.h>

// clang-format off
#include "prelude.h"  // first: the device vocabulary for the kernels defined below
// clang-format on

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
#include "expect_simt_error.h"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "matmul_bias.h"
#include "op_compare.h"
#include "simt.h"

namespace {

using zo::DType;
using zo::simt::expect_simt_error;
using zo::simt::SimtError;
using zo::test::contains;
using zo::test::decode;
using zo::test::dtype_param_name;
using zo::test::encode;
using zo::test::expect_close;

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

// ---- what only a launcher can reach ----------------------------------------------------------
// Every op runs on the emulator through the Device interface in test_cuda_ops_simt (the op-case
// table, op_cases.h). Left here: the bias broadcast, which matmul_forward only takes when cuBLASLt
// has no BIAS epilogue for the operands, and the bias gradient with less scratch than its row
// chunks want (matmul_backward always passes the 32 MiB matmul workspace).

// Host bytes in the storage dtype, standing in for device memory.
struct DevTensor {
  std::vector<std::uint8_t> bytes;
  DType t = DType::kF32;

  void* p() { return bytes.data(); }
  std::vector<float> get() const { return decode(bytes, t); }
};

class SimtBiasKernels : public zo::test::DtypeOpTest {
 protected:
  DevTensor act(const std::vector<float>& x) { return DevTensor{encode(x, t()), t()}; }
};

TEST_P(SimtBiasKernels, BroadcastAndGradientWithLittleScratch) {
  for (const int N : {1, 37, 1000}) {
    for (const int OC : {1, 96, 301}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " OC=" + std::to_string(OC));
      const auto bias = rand(OC), dout = rand(std::size_t(N) * OC), db0 = rand(OC);
      DevTensor b = act(bias), out = act(rand(std::size_t(N) * OC));
      zo::gpu::launch_bias_broadcast(out.p(), b.p(), N, OC, t(), nullptr);
      const std::vector<float> rows = out.get();
      for (int r = 0; r < N; ++r)
        ASSERT_TRUE(std::equal(bias.begin(), bias.end(), rows.begin() + std::size_t(r) * OC)) << r;

      // Column sums in float64 as the reference; no scratch (one pass over all rows) and room
      // for 3 chunks (fewer than 1000 rows want).
      std::vector<float> want(OC);
      for (int c = 0; c < OC; ++c) {
        double s = db0[c];
        for (int r = 0; r < N; ++r)
          s += dout[std::size_t(r) * OC + c];
        want[c] = static_cast<float>(s);
      }
      for (const std::size_t scratch_floats : {std::size_t{0}, std::size_t(OC) * 3}) {
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

INSTANTIATE_TEST_SUITE_P(Dtypes, SimtBiasKernels,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         dtype_param_name);

TEST(SimtLaunchers, BadArgumentsThrowBeforeAnyLaunch) {
  const zo::simt::Stats before = zo::simt::stats();
  float x = 1.0f;
  EXPECT_THROW(
      zo::gpu::launch_attention_forward(&x, &x, &x, {1, 4, 2, 2, 129}, DType::kF32, nullptr),
      std::invalid_argument);  // head size 129
  EXPECT_THROW(
      zo::gpu::launch_attention_forward(&x, &x, &x, {1, 4, 6, 4, 16}, DType::kF32, nullptr),
      std::invalid_argument);  // NH not a multiple of NKV
  EXPECT_THROW(
      zo::gpu::launch_layernorm_forward(&x, &x, &x, &x, &x, nullptr, 1, 1, DType::kF32, nullptr),
      std::invalid_argument);
  EXPECT_THROW(zo::gpu::launch_cast(&x, static_cast<DType>(99), &x, DType::kF32, 1, nullptr),
               std::invalid_argument);
  EXPECT_EQ(zo::simt::stats().launches, before.launches);
}

// The launchers send bf16/fp16 heads of 64 and 128 to the tensor-core kernels (attention_tc.cuh)
// and everything else to the FMA ones; the op-case table checks both against the host backend.
TEST(SimtLaunchers, AttentionTakesTensorCoresForBf16AndFp16Heads64And128) {
  const int T = 5;
  for (const DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int hs : {32, 64, 100, 128}) {
      const std::size_t es = zo::dtype_size(t);
      std::vector<std::uint8_t> qkv(T * 3 * hs * es), out(T * hs * es), dout(T * hs * es),
          dqkv(T * 3 * hs * es);
      std::vector<float> lse(T),
          scratch(zo::gpu::attention_backward_scratch_floats({1, T, 1, 1, hs}));
      const zo::simt::Stats before = zo::simt::stats();
      const zo::gpu::AttentionDims d{1, T, 1, 1, hs};
      zo::gpu::launch_attention_forward(out.data(), lse.data(), qkv.data(), d, t, nullptr);
      zo::gpu::launch_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                         lse.data(), scratch.data(), d, t, nullptr);
      const bool tensor_cores = t != DType::kF32 && (hs == 64 || hs == 128);
      EXPECT_EQ(zo::simt::stats().warp_collectives > before.warp_collectives, tensor_cores)
          << zo::dtype_name(t) << " hs " << hs;
      for (int q = 0; q < T; ++q)  // zero scores: row q averages its q + 1 keys
        EXPECT_NEAR(lse[q], std::log(static_cast<float>(q + 1)), 1e-6f)
            << zo::dtype_name(t) << " hs " << hs;
    }
  }
}

}  // namespace
