// The 8-bit optimizer state (q8): the maps against their format, the quantizer against a
// brute-force search over the map's midpoints (either neighbour within two floats of one) and
// through every code and back, every ISA path bit for bit against the scalar one (odd sizes, every
// grad and output dtype, weight decay both ways, thread counts and block-aligned splits, blocks
// flushed below FLT_MIN), and a float64 reference (dequantize, Adam in double, the nearest code)
// within one code.
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

// The nearest code of x by brute force: how many midpoints of the map (each the float nearest
// the mean of two neighbours) lie below it; for the signed map, of |x| among the non-negative half.
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

// The map as its format defines it: magnitude code c = 2^F + f of `bits` bits lies in decade
// E = bits - 1 - F and is worth fmaf(c, S, C), S = 10^-E * 0.9 / 2^F rounded to float, C the float
// nearest 10^-E - (2^(F + 1) - 1) * S (so that the decade's top code is 10^-E).
float format_value(int c, int bits) {
  if (c == 0) return 0.0f;
  const int f = std::bit_width(unsigned(c)) - 1, e = bits - 1 - f;
  const double top = std::pow(10.0, -e);
  const float s = float(top * 0.9 / std::ldexp(1.0, f));
  const float offset = float(top - (std::ldexp(1.0, f + 1) - 1.0) * double(s));
  return std::fma(float(c), s, offset);
}

TEST(Q8Map, TheMapsAreTheirFormatAscendWithoutRepeatsAndSpanTheUnitRange) {
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
    const std::size_t zero = s ? 127 : 0;
    for (std::size_t c = zero; c < map.size(); ++c)
      EXPECT_EQ(map[c], format_value(int(c - zero), s ? 7 : 8)) << c;
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
    // Random values over every decade, the midpoints and their neighbours, the ends: the
    // brute-force nearest code, or, next to a midpoint, the neighbour across it. "Next to": the
    // code is computed as a float (up to 255, an ulp of 2^-16) before it is rounded, which moves
    // a midpoint by at most about 2^-15 of the step between the two values, or two floats.
    std::vector<float> xs = {0.0f, -0.0f, 1e-30f, 1e-9f, 1.0f, 1.0000001f, 0.9999999f};
    std::uniform_real_distribution<double> exponent(-9.0, 0.0);
    for (int i = 0; i < 200000; ++i) {
      const float x = float(std::pow(10.0, exponent(rng)));
      xs.push_back(s && i % 2 ? -x : x);
    }
    for (std::size_t c = 0; c + 1 < map.size(); ++c) {
      float x = float((double(map[c]) + double(map[c + 1])) / 2.0);
      for (int k = 0; k < 4; ++k)
        x = std::nextafter(x, -2.0f);
      for (int k = 0; k < 9; ++k, x = std::nextafter(x, 2.0f))
        xs.push_back(x);
    }
    int off_by_one = 0;
    for (const float x : xs) {
      const int q = q8_quantize(x, s), want = brute_code(x, s);
      if (q == want) continue;
      ++off_by_one;
      ASSERT_EQ(std::abs(q - want), 1) << x;
      const float mid = float((double(map[std::size_t(q)]) + double(map[std::size_t(want)])) / 2.0);
      const float ulp = std::nextafter(std::fabs(mid), 2.0f) - std::fabs(mid);
      const double step = std::fabs(double(map[std::size_t(q)]) - double(map[std::size_t(want)]));
      EXPECT_LE(std::fabs(x - mid), std::max(2.0 * ulp, std::ldexp(step, -14)))
          << x << " got " << q << " nearest " << want;
    }
    // Each midpoint is probed by nine floats; those between it and where the float code rounds
    // differ (about 1.6 per midpoint: 404 of 254 for m, 398 of 255 for v).
    EXPECT_LT(off_by_one, 2 * int(map.size())) << "only x next to midpoints may differ";
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

// A block whose new maximum falls below FLT_MIN (its reciprocal could overflow) becomes a zero
// block, alike on every path; the other moment of the block keeps its values.
TEST(CpuAdamQ8, BlocksBelowFltMinAreFlushedToZero) {
  std::vector<std::vector<std::uint8_t>> results;
  for (const Isa isa : kAllIsas) {
    if (!zo::cpu_adam::isa_supported(isa)) continue;
    Q8Problem pr(kQ8Block + 21, DType::kF32, 6);
    std::fill(pr.g.begin(), pr.g.end(), 0.0f);
    pr.m_absmax[0] = 1.2e-38f;  // m shrinks by beta1 to about 1.08e-38 < FLT_MIN
    pr.v_absmax[0] = 1e-3f;
    CpuAdam::Options o;
    o.isa = isa;
    CpuAdam adam(config(true, 0.0f), o);
    adam.update(pr.buffers(DType::kBF16, false), 1);
    EXPECT_EQ(pr.m_absmax[0], 0.0f) << zo::cpu_adam::isa_name(isa);
    EXPECT_TRUE(
        std::all_of(pr.m.begin(), pr.m.begin() + kQ8Block, [](auto c) { return c == 127; }));
    EXPECT_GT(pr.v_absmax[0], 0.0f);
    EXPECT_GT(pr.m_absmax[1], 0.0f);
    results.push_back(state_bytes(pr));
  }
  for (const auto& r : results)
    EXPECT_EQ(r, results.front());
}

// State that makes moments non-finite, alike on every path bit for bit over two updates: m's
// code 255 (no map value: NaN), a NaN m absmax beside a finite v one, a gradient that is a NaN
// with its sign set, an infinite v absmax (the tail block, where one code is not 0). Each block
// gets a NaN absmax and every code q8_nan_code, so that the next update reads NaN everywhere in it.
TEST(CpuAdamQ8, NonFiniteStateIsAlikeOnEveryPath) {
  std::vector<std::vector<std::uint8_t>> results;
  for (const Isa isa : kAllIsas) {
    if (!zo::cpu_adam::isa_supported(isa)) continue;
    Q8Problem pr(3 * kQ8Block + 9, DType::kF32, 8);
    pr.m[5] = 255;
    pr.m_absmax[1] = std::numeric_limits<float>::quiet_NaN();
    pr.g[2 * kQ8Block + 3] = std::bit_cast<float>(0xffc00000u);
    pr.v_absmax[3] = std::numeric_limits<float>::infinity();  // a zero block (Q8Problem): one code
    pr.v[3 * kQ8Block + 2] = 200;
    CpuAdam::Options o;
    o.isa = isa;
    CpuAdam adam(config(true, 0.1f), o);
    EXPECT_TRUE(adam.update(pr.buffers(DType::kBF16, true), 1).found_nonfinite);
    for (std::size_t b = 0; b < 4; ++b) {
      const std::size_t e = std::min(pr.n, (b + 1) * kQ8Block);
      EXPECT_TRUE(std::isnan(pr.m_absmax[b]) && std::isnan(pr.v_absmax[b])) << b;
      EXPECT_TRUE(std::all_of(pr.m.begin() + b * kQ8Block, pr.m.begin() + e,
                              [](auto c) { return c == zo::cpu_adam::q8_nan_code(true); }));
      EXPECT_TRUE(std::all_of(pr.v.begin() + b * kQ8Block, pr.v.begin() + e,
                              [](auto c) { return c == zo::cpu_adam::q8_nan_code(false); }));
    }
    pr.g[2 * kQ8Block + 3] = 0.0f;
    adam.update(pr.buffers(DType::kBF16, true), 2);
    EXPECT_TRUE(std::all_of(pr.p.begin(), pr.p.end(), [](float x) { return x != x; }))
        << zo::cpu_adam::isa_name(isa);
    results.push_back(state_bytes(pr));
  }
  for (const auto& r : results)
    EXPECT_EQ(r, results.front());
}

// A block of zeros stays zero without gradients; a non-finite gradient (kReport) makes its
// block's maxima NaN, so the moments read NaN from then on, every one of them; bad buffers are
// refused by name.
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
  // Every element of the NaN block reads NaN on the next update, those that were 0 before too.
  pr.g[kQ8Block + 5] = 0.0f;
  EXPECT_FALSE(adam.update(pr.buffers(DType::kBF16, false), 2).found_nonfinite);  // gradients
  EXPECT_TRUE(std::all_of(pr.p.begin(), pr.p.begin() + kQ8Block, [](float x) { return x == x; }));
  EXPECT_TRUE(std::all_of(pr.p.begin() + kQ8Block, pr.p.end(), [](float x) { return x != x; }));

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
