// The SIMT emulator's warp-level matrix instructions (tests/simt/warp_matrix.h), called through
// the device wrappers the kernels use (gpu/src/mma.cuh). The fragments are built here from the
// PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type", "Warp-level matrix
// load instruction: ldmatrix"), independently of the emulator's tables, and every product is
// compared with a plain triple loop; the values are exact in bf16 and fp16 and so are the
// products and sums, so the comparisons are exact.
#include <gtest/gtest.h>

// clang-format off
#include "prelude.h"  // first: the device vocabulary for the kernels defined below
// clang-format on

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cast.cuh"
#include "expect_simt_error.h"
#include "mma.cuh"

namespace {

using zo::gpu::mma::pack2;
using zo::simt::expect_simt_error;

// Odd multiples of 1/8 in [-31/8, 31/8]: exact in bf16 and fp16, distinct enough that a
// misplaced element changes the product.
std::vector<float> odd_values(std::size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(-16, 15);
  std::vector<float> x(n);
  for (float& v : x)
    v = static_cast<float>(2 * pick(rng) + 1) / 8.0f;
  return x;
}

// d (M x N) = c + reps * a (M x K) * b (K x N), all row-major, in double.
std::vector<float> reference(const std::vector<float>& a, const std::vector<float>& b,
                             const std::vector<float>& c, int M, int N, int K, int reps) {
  std::vector<float> d(std::size_t(M) * N);
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double s = 0.0;
      for (int k = 0; k < K; ++k)
        s += double(a[m * K + k]) * b[k * N + n];
      d[m * N + n] = static_cast<float>(c[m * N + n] + reps * s);
    }
  }
  return d;
}

// One warp: fragments of a (16x16), b (16x8) and c (16x8), all row-major in global memory, from
// the documented layouts; d = c + 2 a b through two chained mma.
template <typename T>
__global__ void mma_documented_layout_kernel(float* d, const float* a, const float* b,
                                             const float* c) {
  const int lane = static_cast<int>(threadIdx.x), group = lane >> 2, tig = lane % 4;
  std::uint32_t af[4], bf[2];
  float acc[4];
  for (int i = 0; i < 8; i += 2) {  // a_i, a_i+1 share a register
    const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
    const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
    af[i / 2] = pack2<T>(a[row * 16 + col], a[row * 16 + col + 1]);
  }
  for (int i = 0; i < 4; i += 2) {
    const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
    bf[i / 2] = pack2<T>(b[row * 8 + group], b[(row + 1) * 8 + group]);
  }
  for (int i = 0; i < 4; ++i)
    acc[i] = c[(i < 2 ? group : group + 8) * 8 + tig * 2 + (i & 1)];
  zo::gpu::mma::mma_m16n8k16<T>(acc, af, bf[0], bf[1]);
  zo::gpu::mma::mma_m16n8k16<T>(acc, af, bf[0], bf[1]);
  for (int i = 0; i < 4; ++i)
    d[(i < 2 ? group : group + 8) * 8 + tig * 2 + (i & 1)] = acc[i];
}

template <typename T>
void check_mma_layout(const char* name) {
  SCOPED_TRACE(name);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    const auto a = odd_values(16 * 16, rng), b = odd_values(16 * 8, rng),
               c = odd_values(16 * 8, rng);
    std::vector<float> d(16 * 8, NAN);
    ZO_LAUNCH(1, 32, 0, nullptr, mma_documented_layout_kernel<T>)
    (d.data(), a.data(), b.data(), c.data());
    EXPECT_EQ(d, reference(a, b, c, 16, 8, 16, 2)) << "trial " << trial;
  }
}

TEST(SimtEmulator, MmaMatchesATripleLoopInTheDocumentedFragmentLayouts) {
  check_mma_layout<__nv_bfloat16>("mma.m16n8k16.row.col.f32.bf16.bf16.f32");
  check_mma_layout<__half>("mma.m16n8k16.row.col.f32.f16.f16.f32");
}

// Lane l gives the address of shared row 31 - l (rows `stride` elements apart), so that the
// rows of each matrix come in reverse order and lanes past 8 num point at rows of their own,
// which the instruction must not read.
template <int kNum, bool kTrans>
__global__ void ldmatrix_kernel(std::uint32_t* out, const std::uint16_t* src, int stride) {
  ZO_DYNAMIC_SHARED(float4, smem4);
  auto* smem = reinterpret_cast<std::uint16_t*>(smem4);
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 32 * stride; i += 32)
    smem[i] = src[i];
  __syncthreads();
  std::uint32_t r[kNum];
  const std::uint16_t* row = smem + (31 - lane) * stride;
  if constexpr (kNum == 4) {  // the kernels' form, through their wrapper
    zo::gpu::mma::ldmatrix_x4<kTrans>(r, row);
  } else {
    zo::simt::ldmatrix(kNum, kTrans, r, row, std::source_location::current());
  }
  for (int i = 0; i < kNum; ++i)
    out[lane * kNum + i] = r[i];
}

template <int kNum, bool kTrans>
void check_ldmatrix() {
  SCOPED_TRACE("ldmatrix .x" + std::to_string(kNum) + (kTrans ? ".trans" : ""));
  const int stride = 24;  // padded rows: 48 bytes
  std::vector<std::uint16_t> src(32 * stride);
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = static_cast<std::uint16_t>(1000 + 7 * i);
  std::vector<std::uint32_t> out(32 * kNum, 0);
  const std::size_t smem = src.size() * sizeof(std::uint16_t);
  ZO_LAUNCH(1, 32, smem, nullptr, ldmatrix_kernel<kNum, kTrans>)(out.data(), src.data(), stride);
  // Element (r, c) of matrix i: column c of the row whose address lane 8 i + r gave.
  auto element = [&](int i, int r, int c) { return src[(31 - (8 * i + r)) * stride + c]; };
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < kNum; ++i) {
      const int r = lane / 4, c = 2 * (lane % 4);
      const std::uint32_t lo = kTrans ? element(i, c, r) : element(i, r, c);
      const std::uint32_t hi = kTrans ? element(i, c + 1, r) : element(i, r, c + 1);
      EXPECT_EQ(out[lane * kNum + i], lo | hi << 16) << "lane " << lane << " matrix " << i;
    }
  }
}

TEST(SimtEmulator, LdmatrixLoadsTheDocumentedFragments) {
  check_ldmatrix<1, false>();
  check_ldmatrix<2, false>();
  check_ldmatrix<4, false>();
  check_ldmatrix<1, true>();
  check_ldmatrix<2, true>();
  check_ldmatrix<4, true>();
}

// The attention kernels' pattern: a (16x16) through ldmatrix.x4, and two 8-column tiles of b
// (16x16) either from its transpose bt (n rows of k, ldmatrix.x4) or from b itself (k rows of
// n, ldmatrix.x4.trans); d0 = a b from the first, d1 = a b from the second. Shared rows are 24
// elements apart.
template <typename T>
__global__ void mma_from_shared_kernel(float* d0, float* d1, const float* a, const float* b,
                                       const float* bt) {
  constexpr int kLd = 24;
  ZO_DYNAMIC_SHARED(float4, smem4);
  T* sa = reinterpret_cast<T*>(smem4);
  T* sb = sa + 16 * kLd;
  T* sbt = sb + 16 * kLd;
  const int lane = static_cast<int>(threadIdx.x), group = lane >> 2, tig = lane % 4;
  for (int i = lane; i < 256; i += 32) {
    sa[i / 16 * kLd + i % 16] = zo::gpu::from_float<T>(a[i]);
    sb[i / 16 * kLd + i % 16] = zo::gpu::from_float<T>(b[i]);
    sbt[i / 16 * kLd + i % 16] = zo::gpu::from_float<T>(bt[i]);
  }
  __syncthreads();
  // Matrices in fragment order: a's (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15);
  // the same for b with .trans; bt's (0-7, 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
  const int row_a = (lane & 7) + ((lane >> 3) & 1) * 8, col_a = (lane >> 4) * 8;
  const int row_bt = (lane & 7) + (lane >> 4) * 8, col_bt = ((lane >> 3) & 1) * 8;
  std::uint32_t af[4], bf[4], bft[4];
  zo::gpu::mma::ldmatrix_x4(af, sa + row_a * kLd + col_a);
  zo::gpu::mma::ldmatrix_x4(bft, sbt + row_bt * kLd + col_bt);
  zo::gpu::mma::ldmatrix_x4<true>(bf, sb + row_a * kLd + col_a);
  float acc0[2][4] = {}, acc1[2][4] = {};
  for (int n = 0; n < 2; ++n) {
    zo::gpu::mma::mma_m16n8k16<T>(acc0[n], af, bft[2 * n], bft[2 * n + 1]);
    zo::gpu::mma::mma_m16n8k16<T>(acc1[n], af, bf[2 * n], bf[2 * n + 1]);
  }
  for (int n = 0; n < 2; ++n) {
    for (int i = 0; i < 4; ++i) {
      const int at = (i < 2 ? group : group + 8) * 16 + 8 * n + tig * 2 + (i & 1);
      d0[at] = acc0[n][i];
      d1[at] = acc1[n][i];
    }
  }
}

template <typename T>
void check_mma_from_shared(const char* name) {
  SCOPED_TRACE(name);
  std::mt19937 rng(11);
  const auto a = odd_values(256, rng), b = odd_values(256, rng);
  std::vector<float> bt(256);
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 16; ++n)
      bt[n * 16 + k] = b[k * 16 + n];
  }
  std::vector<float> d0(256, NAN), d1(256, NAN);
  const std::size_t smem = 3 * 16 * 24 * sizeof(T);
  ZO_LAUNCH(1, 32, smem, nullptr, mma_from_shared_kernel<T>)
  (d0.data(), d1.data(), a.data(), b.data(), bt.data());
  const auto want = reference(a, b, std::vector<float>(256, 0.0f), 16, 16, 16, 1);
  EXPECT_EQ(d0, want) << "b^T through ldmatrix.x4";
  EXPECT_EQ(d1, want) << "b through ldmatrix.x4.trans";
}

TEST(SimtEmulator, MmaOfLdmatrixFragmentsMatchesATripleLoop) {
  check_mma_from_shared<__nv_bfloat16>("bf16");
  check_mma_from_shared<__half>("fp16");
}

// One thread: copies of every size into shared memory, snapshots of it (24 floats each) after
// each step: issue, wait_group 2, 1, 0 (the uncommitted copy stays out), commit + wait_group 0.
// A copy lands at the wait that covers its group, never earlier.
__global__ void cp_async_kernel(float* snapshots, const float* src) {
  ZO_DYNAMIC_SHARED(float4, smem4);
  auto* smem = reinterpret_cast<float*>(smem4);
  for (int i = 0; i < 24; ++i)
    smem[i] = -1.0f;
  namespace mma = zo::gpu::mma;
  mma::cp_async_ca<4>(smem, src, 4);
  mma::cp_async_ca<8>(smem + 2, src + 2, 8);
  mma::cp_async_ca<16>(smem + 4, src + 4, 16);
  mma::cp_async_commit();
  mma::cp_async_cg16(smem + 8, src + 8, 16);
  mma::cp_async_ca<16>(smem + 12, src + 12, 8);  // two floats read, two zero-filled
  mma::cp_async_ca<8>(smem + 16, src + 16, 0);   // nothing read: zeros
  mma::cp_async_commit();
  mma::cp_async_ca<4>(smem + 20, src + 20, 4);  // not committed yet
  auto snapshot = [&](int k) {
    for (int i = 0; i < 24; ++i)
      snapshots[k * 24 + i] = smem[i];
  };
  snapshot(0);
  mma::cp_async_wait<2>();
  snapshot(1);
  mma::cp_async_wait<1>();
  snapshot(2);
  mma::cp_async_wait<0>();
  snapshot(3);
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  snapshot(4);
}

TEST(SimtEmulator, CpAsyncLandsAtTheWaitThatCoversItsGroup) {
  std::vector<float> src(24), snapshots(5 * 24, NAN);
  for (int i = 0; i < 24; ++i)
    src[i] = static_cast<float>(i + 1);
  ZO_LAUNCH(1, 1, 24 * sizeof(float), nullptr, cp_async_kernel)(snapshots.data(), src.data());
  // Destinations in flight read as NaN; untouched floats stay -1.
  std::vector<float> want(24, -1.0f);
  for (const int i : {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20})
    want[i] = NAN;
  auto expect_step = [&](int k) {
    for (int i = 0; i < 24; ++i) {
      const float got = snapshots[k * 24 + i];
      EXPECT_TRUE(std::isnan(want[i]) ? std::isnan(got) : got == want[i])
          << "snapshot " << k << " float " << i << ": " << got << ", want " << want[i];
    }
  };
  expect_step(0);  // issued, nothing waited for
  expect_step(1);  // wait_group 2: both groups may stay pending
  for (int i = 0; i < 8; ++i)
    want[i] = i == 1 ? -1.0f : src[i];  // smem[1] lies between the 4- and the 8-byte copy
  expect_step(2);                       // wait_group 1: the first group
  for (int i = 8; i < 14; ++i)
    want[i] = src[i];
  want[14] = want[15] = want[16] = want[17] = 0.0f;
  expect_step(3);  // wait_group 0: the second, with its zero fill; not the uncommitted copy
  want[20] = src[20];
  expect_step(4);
}

template <int kCase>
__global__ void bad_matrix_kernel(float* out) {
  ZO_DYNAMIC_SHARED(float4, smem4);
  auto* smem = reinterpret_cast<std::uint16_t*>(smem4);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  std::uint32_t a[4] = {}, r[1];
  float d[4] = {};
  if constexpr (kCase == 0) {  // a lane leaves before the warp's mma
    if (lane == 7) return;
    zo::gpu::mma::mma_m16n8k16<__half>(d, a, 0, 0);
  } else if constexpr (kCase == 1) {  // half the warp at another mma
    if (lane < 16) {
      zo::gpu::mma::mma_m16n8k16<__half>(d, a, 0, 0);
    } else {
      zo::gpu::mma::mma_m16n8k16<__nv_bfloat16>(d, a, 0, 0);
    }
  } else if constexpr (kCase == 2) {  // launched with a partial warp
    zo::gpu::mma::mma_m16n8k16<__half>(d, a, 0, 0);
  } else if constexpr (kCase == 3) {  // one lane waits at a barrier instead
    if (lane == 3) {
      __syncthreads();
    } else {
      zo::simt::ldmatrix(1, false, r, smem + 8 * lane, std::source_location::current());
    }
  } else if constexpr (kCase == 4) {
    zo::simt::ldmatrix(1, false, r, smem + 8 * lane + 1, std::source_location::current());
  } else if constexpr (kCase == 5) {
    zo::simt::ldmatrix(1, false, r, out, std::source_location::current());
  } else if constexpr (kCase == 6) {
    zo::gpu::mma::cp_async_ca<8>(smem + 2, out, 8);
  } else if constexpr (kCase == 7) {
    zo::gpu::mma::cp_async_ca<4>(out, out + 1, 4);
  } else {
    zo::simt::cp_async(zo::simt::CacheOp::kCg, smem, out, 8, 8, std::source_location::current());
  }
  out[threadIdx.x] = d[0];
}

TEST(SimtEmulator, ReportsMatrixInstructionsTheHardwareWouldNotRun) {
  std::vector<float> out(64, 0.0f);
  const std::size_t smem = 1024;
  auto run = [&](auto kernel, int threads) {
    return [&, kernel, threads] { ZO_LAUNCH(1, threads, smem, nullptr, kernel)(out.data()); };
  };
  expect_simt_error(run(bad_matrix_kernel<0>, 32), "lane 7, which has exited");
  expect_simt_error(run(bad_matrix_kernel<1>, 32), "meet at different warp syncs");
  expect_simt_error(run(bad_matrix_kernel<2>, 48), "does not exist");
  expect_simt_error(run(bad_matrix_kernel<3>, 32), "deadlock");
  expect_simt_error(run(bad_matrix_kernel<4>, 32), "is not 16-byte aligned");
  expect_simt_error(run(bad_matrix_kernel<5>, 32), "outside the block's dynamic shared memory");
  expect_simt_error(run(bad_matrix_kernel<6>, 1), "not aligned to its 8 bytes");
  expect_simt_error(run(bad_matrix_kernel<7>, 1), "destination outside");
  expect_simt_error(run(bad_matrix_kernel<8>, 1), "copies 16 bytes only");
  // Whole warps at one site are fine.
  ZO_LAUNCH(1, 64, smem, nullptr, bad_matrix_kernel<2>)(out.data());
}

}  // namespace
