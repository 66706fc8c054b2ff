// The 8-bit optimizer state (q8): the maps and their quantizer against a brute-force search over
// the map's midpoints, every ISA path bit for bit against the scalar one (odd sizes, every grad
// and output dtype, weight decay both ways, thread counts and block-aligned splits), and a
// float64 reference (dequantize, Adam in double, the nearest code) within one code.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cpu_adam/cpu_adam.h"

namespace {

using zo::AdamConfig;
using zo::DType;
using zo::cpu_adam::AdamBuffers;
using zo::cpu_adam::CpuAdam;
using zo::cpu_adam::Isa;
using zo::cpu_adam::kQ8Block;
using zo::cpu_adam::q8_map;
using zo::cpu_adam::q8_quantize;

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};

// The code of x by brute force: how many midpoints of the map (each the float nearest the mean
// of two neighbours) lie below it; for the signed map, of |x| among the non-negative half.
int brute_code(float x, bool is_signed) {
  const auto map = q8_map(is_signed);
  const std::size_t zero = is_signed ? 127 : 0;
  const float a = std::fabs(x);
  int q = 0;
  for (std::size_t c = zero; c + 1 < map.size(); ++c) {
    if (float((double(map[c]) + double(map[c + 1])) / 2.0) < a) ++q;
  }
  if (!is_signed) return q;
  return x < 0.0f ? 127 - q : 127 + q;
}

TEST(Q8Map, TheMapsAscendWithoutRepeatsAndSpanTheUnitRange) {
  for (const bool s : {true, false}) {
    const auto map = q8_map(s);
    ASSERT_EQ(map.size(), s ? 255u : 256u);
    for (std::size_t c = 1; c < map.size(); ++c)
      EXPECT_LT(map[c - 1], map[c]) << c;
    EXPECT_EQ(map.back(), 1.0f);
    EXPECT_EQ(map.front(), s ? -1.0f : 0.0f);
    if (s) {
      EXPECT_EQ(map[127], 0.0f);
      for (std::size_t c = 0; c < 127; ++c)
        EXPECT_EQ(map[c], -map[254 - c]);
    }
    // Decades of 10: the smallest non-zero magnitude is 10^-6 (m) or 10^-7 (v).
    EXPECT_FLOAT_EQ(map[s ? 128 : 1], s ? 1e-6f : 1e-7f);
  }
}

TEST(Q8Map, TheQuantizerIsTheNearestCodeAndRoundTrips) {
  std::mt19937 rng(5);
  for (const bool s : {true, false}) {
    const auto map = q8_map(s);
    // quantize(dequantize(q)) == q, also through a block's scale and its reciprocal.
    for (std::size_t c = 0; c < map.size(); ++c) {
      EXPECT_EQ(q8_quantize(map[c], s), c) << c;
      for (const float absmax : {3.7e-9f, 0.031f, 1.0f, 913.5f, 2.1e12f}) {
        const float x = (map[c] * absmax) * (1.0f / absmax);
        EXPECT_EQ(q8_quantize(x, s), c) << c << " absmax " << absmax;
      }
    }
    // Random values over every decade, the midpoints and their neighbours: the brute-force
    // count, which is the nearest map value.
    std::vector<float> xs = {0.0f, -0.0f, 1e-30f, 1.0f, 1.0000001f, 0.9999999f};
    std::uniform_real_distribution<double> exponent(-9.0, 0.0);
    for (int i = 0; i < 200000; ++i) {
      const float x = float(std::pow(10.0, exponent(rng)));
      xs.push_back(s && i % 2 ? -x : x);
    }
    for (std::size_t c = 0; c + 1 < map.size(); ++c) {
      const float mid = float((double(map[c]) + double(map[c + 1])) / 2.0);
      for (const float x : {mid, std::nextafter(mid, 2.0f), std::nextafter(mid, -2.0f)})
        xs.push_back(x);
    }
    for (const float x : xs) {
      const int q = q8_quantize(x, s);
      ASSERT_EQ(q, brute_code(x, s)) << x;
      for (const int other : {q - 1, q + 1}) {
        if (other < 0 || other >= int(map.size())) continue;
        // Nearest, but for a midpoint rounded to float: within an ulp of x.
        EXPECT_LE(std::fabs(double(x) - map[std::size_t(q)]),
                  std::fabs(double(x) - map[std::size_t(other)]) + std::fabs(x) * 0x1p-22)
            << x;
      }
    }
  }
}

// n parameters with q8 state, random but valid: codes, block maxima, weights, gradients.
struct Q8Problem {
  std::size_t n;
  DType g_dtype;
  std::vector<float> p;
  std::vector<std::uint8_t> m, v;
  std::vector<float> m_absmax, v_absmax;
  std::vector<float> g;            // the gradients as fp32 (rounded to g_dtype when 16-bit)
  std::vector<std::uint16_t> g16;  // their 16-bit words when g_dtype is not kF32
  std::vector<std::uint16_t> out;

  Q8Problem(std::size_t size, DType gd, std::uint32_t seed)
      : n(size),
        g_dtype(gd),
        p(size),
        m(size),
        v(size),
        m_absmax(zo::cpu_adam::q8_blocks(size)),
        v_absmax(m_absmax.size()),
        g(size),
        g16(size),
        out(size) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> code(0, 254);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      m[i] = std::uint8_t(code(rng));
      v[i] = std::uint8_t(code(rng) + 1);
    }
    for (std::size_t b = 0; b < m_absmax.size(); ++b) {
      m_absmax[b] = b % 7 == 3 ? 0.0f : std::fabs(normal(rng)) * 1e-3f;  // some all-zero blocks
      v_absmax[b] = b % 7 == 3 ? 0.0f : std::fabs(normal(rng)) * 1e-6f;
      if (b % 7 == 3) {
        for (std::size_t i = b * kQ8Block; i < std::min(n, (b + 1) * kQ8Block); ++i) {
          m[i] = 127;
          v[i] = 0;
        }
      }
    }
    new_grads(rng);
  }
  void new_grads(std::mt19937& rng) {
    std::normal_distribution<float> normal;
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = normal(rng) * (i % 11 == 0 ? 30.0f : 0.01f);
      if (g_dtype == DType::kF16) g16[i] = zo::float_to_half(g[i]);
      if (g_dtype == DType::kBF16) g16[i] = zo::float_to_bf16(g[i]);
    }
  }
  AdamBuffers buffers(DType out_dtype, bool with_out) {
    AdamBuffers b;
    b.params = p;
    b.grads = g_dtype == DType::kF32 ? zo::cpu_adam::ConstArrayView{g.data(), n, DType::kF32}
                                     : zo::cpu_adam::ConstArrayView{g16.data(), n, g_dtype};
    if (with_out) b.params_out = {out.data(), n, out_dtype};
    b.q8 = {m.data(), v.data(), m_absmax.data(), v_absmax.data(), m_absmax.size()};
    return b;
  }
};

AdamConfig config(bool decoupled, float wd) {
  AdamConfig c;
  c.lr = 1e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.weight_decay = wd;
  c.decoupled_weight_decay = decoupled;
  return c;
}

// Everything a run leaves, bit for bit.
std::vector<std::uint8_t> state_bytes(const Q8Problem& pr) {
  std::vector<std::uint8_t> out;
  auto put = [&out](const void* d, std::size_t bytes) {
    out.insert(out.end(), static_cast<const std::uint8_t*>(d),
               static_cast<const std::uint8_t*>(d) + bytes);
  };
  put(pr.p.data(), pr.n * 4);
  put(pr.m.data(), pr.n);
  put(pr.v.data(), pr.n);
  put(pr.m_absmax.data(), pr.m_absmax.size() * 4);
  put(pr.v_absmax.data(), pr.v_absmax.size() * 4);
  put(pr.out.data(), pr.n * 2);
  return out;
}

std::uint16_t* out_of(const AdamBuffers& b, std::size_t at) {
  return static_cast<std::uint16_t*>(b.params_out.data) + at;
}

// Three steps of one problem on `isa` with `threads`, the arrays split at `split` (0: none).
std::vector<std::uint8_t> run(Isa isa, std::size_t n, DType g, DType out, bool with_out,
                              const AdamConfig& c, float mult, int threads = 0,
                              std::size_t split = 0) {
  Q8Problem pr(n, g, std::uint32_t(n * 31 + int(g)));
  CpuAdam::Options o;
  o.isa = isa;
  o.threads = threads;
  CpuAdam adam(c, o);
  std::mt19937 rng(9);
  for (std::int64_t t = 1; t <= 3; ++t) {
    if (t > 1) pr.new_grads(rng);
    AdamBuffers all = pr.buffers(out, with_out);
    if (split == 0 || split >= n) {
      adam.update(all, t, {mult});
      continue;
    }
    for (const auto& [b, e] : {std::pair{split, n}, std::pair{std::size_t{0}, split}}) {
      AdamBuffers x = all;
      x.params = all.params.subspan(b, e - b);
      x.grads = {static_cast<const char*>(all.grads.data) + b * zo::dtype_size(g), e - b, g};
      if (with_out) x.params_out = {out_of(all, b), e - b, out};
      x.q8 = {pr.m.data() + b, pr.v.data() + b, pr.m_absmax.data() + b / kQ8Block,
              pr.v_absmax.data() + b / kQ8Block, zo::cpu_adam::q8_blocks(e - b)};
      adam.update(x, t, {mult});
    }
  }
  return state_bytes(pr);
}

class IsaQ8 : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!zo::cpu_adam::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << zo::cpu_adam::isa_name(GetParam()) << " path";
    }
  }
};

TEST_P(IsaQ8, EveryPathEqualsScalarBitForBit) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{7}, kQ8Block - 1, kQ8Block, kQ8Block + 1,
                              std::size_t{16384 + 5}, std::size_t{40013}}) {
    for (const DType g : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int o = 0; o < 3; ++o) {
        const DType out = o == 2 ? DType::kBF16 : DType::kF16;
        for (const auto& [c, mult] :
             {std::pair{config(true, 0.1f), 1.0f}, std::pair{config(false, 0.05f), 0.37f}}) {
          const auto want = run(Isa::kScalar, n, g, out, o != 0, c, mult);
          EXPECT_EQ(run(GetParam(), n, g, out, o != 0, c, mult), want)
              << "n " << n << " grads " << zo::dtype_name(g) << " out " << o;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, IsaQ8, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& p) {
                           return std::string(zo::cpu_adam::isa_name(p.param));
                         });

// Thread counts never change a bit, nor splits at block boundaries (the offload engine's calls
// are per tensor, so blocks never straddle one).
TEST(CpuAdamQ8, ResultsIndependentOfThreadCountAndBlockAlignedSplits) {
  const std::size_t n = 5 * 16384 + 999;
  const auto want = run(zo::cpu_adam::best_isa(), n, DType::kBF16, DType::kBF16, true,
                        config(true, 0.1f), 1.0f, 1);
  for (const int threads : {2, 5}) {
    for (const std::size_t split : {std::size_t{0}, 3 * kQ8Block, std::size_t{16384 * 2}}) {
      EXPECT_EQ(run(zo::cpu_adam::best_isa(), n, DType::kBF16, DType::kBF16, true,
                    config(true, 0.1f), 1.0f, threads, split),
                want)
          << threads << " threads, split " << split;
    }
  }
}

// One step against float64: dequantize, Adam in double, the block maxima and the nearest codes.
TEST(CpuAdamQ8, MatchesAFloat64ReferenceWithinOneCode) {
  const std::size_t n = 3 * kQ8Block + 77;
  Q8Problem pr(n, DType::kF32, 3);
  const Q8Problem before = pr;
  const AdamConfig c = config(true, 0.1f);
  CpuAdam(c).update(pr.buffers(DType::kBF16, false), 1);
  const auto sm = q8_map(true), um = q8_map(false);
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr;
  for (std::size_t blk = 0; blk < before.m_absmax.size(); ++blk) {
    const std::size_t lo = blk * kQ8Block, hi = std::min(n, lo + kQ8Block);
    std::vector<double> m(hi - lo), v(hi - lo);
    double mmax = 0, vmax = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      const double g = before.g[i];
      m[i - lo] = b1 * sm[before.m[i]] * before.m_absmax[blk] + (1 - b1) * g;
      v[i - lo] = b2 * um[before.v[i]] * before.v_absmax[blk] + (1 - b2) * g * g;
      mmax = std::max(mmax, std::fabs(m[i - lo]));
      vmax = std::max(vmax, v[i - lo]);
      const double p =
          before.p[i] * (1 - lr * c.weight_decay) -
          lr / (1 - b1) * m[i - lo] / (std::sqrt(v[i - lo]) / std::sqrt(1 - b2) + double(c.eps));
      EXPECT_NEAR(pr.p[i], p, 1e-6 * std::max(1.0, std::fabs(p))) << i;
    }
    EXPECT_NEAR(pr.m_absmax[blk], mmax, 1e-6 * mmax) << blk;
    EXPECT_NEAR(pr.v_absmax[blk], vmax, 1e-6 * vmax) << blk;
    for (std::size_t i = lo; i < hi; ++i) {
      const auto nearest = [](std::span<const float> map, double x) {
        return int(std::min_element(
                       map.begin(), map.end(),
                       [x](float a, float b) { return std::fabs(a - x) < std::fabs(b - x); }) -
                   map.begin());
      };
      EXPECT_LE(std::abs(int(pr.m[i]) - nearest(sm, m[i - lo] / mmax)), 1) << i;
      EXPECT_LE(std::abs(int(pr.v[i]) - nearest(um, v[i - lo] / vmax)), 1) << i;
    }
  }
}

// A block of zeros stays zero without gradients; a non-finite gradient (kReport) makes its
// block's maxima NaN, so the moments read NaN from then on; bad buffers are refused by name.
TEST(CpuAdamQ8, ZeroBlocksNonFiniteBlocksAndRefusals) {
  Q8Problem pr(2 * kQ8Block, DType::kF32, 4);
  std::fill(pr.g.begin(), pr.g.end(), 0.0f);
  std::fill(pr.m.begin(), pr.m.end(), 127);
  std::fill(pr.v.begin(), pr.v.end(), 0);
  std::fill(pr.m_absmax.begin(), pr.m_absmax.end(), 0.0f);
  std::fill(pr.v_absmax.begin(), pr.v_absmax.end(), 0.0f);
  pr.g[kQ8Block + 5] = std::numeric_limits<float>::quiet_NaN();
  CpuAdam adam(config(true, 0.0f));
  EXPECT_TRUE(adam.update(pr.buffers(DType::kBF16, false), 1).found_nonfinite);
  EXPECT_EQ(pr.m_absmax[0], 0.0f);
  EXPECT_EQ(pr.v_absmax[0], 0.0f);
  EXPECT_TRUE(std::all_of(pr.m.begin(), pr.m.begin() + kQ8Block, [](auto c) { return c == 127; }));
  EXPECT_TRUE(std::isnan(pr.m_absmax[1]) && std::isnan(pr.v_absmax[1]));

  AdamBuffers b = pr.buffers(DType::kBF16, false);
  const auto error = [&](AdamBuffers x) {
    try {
      adam.update(x, 1);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  AdamBuffers x = b;
  x.q8.blocks = 1;
  EXPECT_NE(error(x).find("has 1 blocks for 4096 elements; it needs 2"), std::string::npos);
  x = b;
  x.q8.v_absmax = nullptr;
  EXPECT_NE(error(x).find("both absmax arrays"), std::string::npos);
  x = b;
  x.exp_avg = {pr.p.data(), pr.n, DType::kF32};
  EXPECT_NE(error(x).find("replaces exp_avg"), std::string::npos);
}

}  // namespace
