// bf16 master weights rounded stochastically: every ISA path bit for bit against the scalar one
// (odd sizes, fp32, bf16 and q8 state, every grad and output dtype, weight decay both ways, index
// ranges across 2^32), independent of thread count and splits; the scalar result against a
// float64 Adam update (one of its two bf16 neighbours, unbiased over many draws); the random bits
// uniform and pinned; the rounding's special values; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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
using zo::cpu_adam::bf16_round_stochastic;
using zo::cpu_adam::CpuAdam;
using zo::cpu_adam::Isa;
using zo::cpu_adam::kQ8Block;
using zo::cpu_adam::sr_bits;

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};
enum class State { kF32, kBF16, kQ8 };
constexpr State kAllStates[] = {State::kF32, State::kBF16, State::kQ8};

std::string state_name(State s) {
  return s == State::kF32 ? "fp32" : s == State::kBF16 ? "bf16" : "q8";
}

float from_bf16(std::uint16_t b) {
  return std::bit_cast<float>(std::uint32_t{b} << 16);
}

// n parameters with bf16 master weights and state of one format, random but valid.
struct Problem {
  std::size_t n;
  DType g_dtype;
  State state;
  std::vector<std::uint16_t> p;
  std::vector<float> m32, v32;
  std::vector<std::uint16_t> m16, v16;
  std::vector<std::uint8_t> mq, vq;
  std::vector<float> m_absmax, v_absmax;
  std::vector<float> g;            // the gradients as fp32 (rounded to g_dtype when 16-bit)
  std::vector<std::uint16_t> g16;  // their 16-bit words when g_dtype is not kF32
  std::vector<std::uint16_t> out;

  Problem(std::size_t size, DType gd, State s, std::uint32_t seed)
      : n(size),
        g_dtype(gd),
        state(s),
        p(size),
        m32(size),
        v32(size),
        m16(size),
        v16(size),
        mq(size),
        vq(size),
        m_absmax(zo::cpu_adam::q8_blocks(size)),
        v_absmax(m_absmax.size()),
        g(size),
        g16(size),
        out(size) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> code(0, 254);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = zo::float_to_bf16(normal(rng));
      m32[i] = normal(rng) * 1e-3f;
      v32[i] = std::fabs(normal(rng)) * 1e-6f;
      m16[i] = zo::float_to_bf16(m32[i]);
      v16[i] = zo::float_to_bf16(v32[i]);
      mq[i] = std::uint8_t(code(rng));
      vq[i] = std::uint8_t(code(rng) + 1);
    }
    for (std::size_t b = 0; b < m_absmax.size(); ++b) {
      m_absmax[b] = std::fabs(normal(rng)) * 1e-3f;
      v_absmax[b] = std::fabs(normal(rng)) * 1e-6f;
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
  // Elements [b, e) as one call's buffers; b is a multiple of kQ8Block with q8 state.
  AdamBuffers buffers(std::size_t b, std::size_t e, DType out_dtype, bool with_out,
                      std::uint64_t seed, std::uint64_t first_index) {
    const std::size_t k = e - b;
    AdamBuffers x;
    x.bf16_master = {p.data() + b, seed, first_index + b};
    x.grads = g_dtype == DType::kF32 ? zo::cpu_adam::ConstArrayView{g.data() + b, k, DType::kF32}
                                     : zo::cpu_adam::ConstArrayView{g16.data() + b, k, g_dtype};
    if (with_out) x.params_out = {out.data() + b, k, out_dtype};
    switch (state) {
      case State::kF32:
        x.exp_avg = {m32.data() + b, k, DType::kF32};
        x.exp_avg_sq = {v32.data() + b, k, DType::kF32};
        break;
      case State::kBF16:
        x.exp_avg = {m16.data() + b, k, DType::kBF16};
        x.exp_avg_sq = {v16.data() + b, k, DType::kBF16};
        break;
      case State::kQ8:
        x.q8 = {mq.data() + b, vq.data() + b, m_absmax.data() + b / kQ8Block,
                v_absmax.data() + b / kQ8Block, zo::cpu_adam::q8_blocks(k)};
        break;
    }
    return x;
  }
  // Everything a run leaves, bit for bit.
  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> all;
    auto put = [&all](const auto& v) {
      const auto* d = reinterpret_cast<const std::uint8_t*>(v.data());
      all.insert(all.end(), d, d + v.size() * sizeof(v[0]));
    };
    put(p);
    put(out);
    if (state == State::kF32) put(m32), put(v32);
    if (state == State::kBF16) put(m16), put(v16);
    if (state == State::kQ8) put(mq), put(vq), put(m_absmax), put(v_absmax);
    return all;
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

struct Case {
  std::size_t n = 0;
  DType grads = DType::kF32;
  State state = State::kF32;
  DType out = DType::kBF16;
  bool with_out = false;
  AdamConfig config = ::config(true, 0.1f);
  float mult = 1.0f;
  std::uint64_t first_index = 0;
  int threads = 0;
  std::vector<std::size_t> splits;  // call boundaries inside [0, n), ascending
};

// Three updates of one problem on `isa`, each split into calls at r.splits (in reverse order).
std::vector<std::uint8_t> run(Isa isa, const Case& r) {
  Problem pr(r.n, r.grads, r.state, std::uint32_t(r.n * 31 + int(r.grads)));
  CpuAdam::Options o;
  o.isa = isa;
  o.threads = r.threads;
  CpuAdam adam(r.config, o);
  std::mt19937 rng(9);
  std::vector<std::size_t> cuts = {0};
  cuts.insert(cuts.end(), r.splits.begin(), r.splits.end());
  cuts.push_back(r.n);
  for (std::int64_t t = 1; t <= 3; ++t) {
    if (t > 1) pr.new_grads(rng);
    for (std::size_t c = cuts.size() - 1; c > 0; --c) {
      adam.update(pr.buffers(cuts[c - 1], cuts[c], r.out, r.with_out, 77, r.first_index), t,
                  {r.mult});
    }
  }
  return pr.bytes();
}

class IsaBf16Master : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!zo::cpu_adam::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << zo::cpu_adam::isa_name(GetParam()) << " path";
    }
  }
};

TEST_P(IsaBf16Master, EveryPathEqualsScalarBitForBit) {
  // Index ranges from 0, across 2^31 (where a signed lane index would overflow), across 2^32
  // (inside a vector) and beyond.
  const std::uint64_t firsts[] = {0, (std::uint64_t{1} << 31) - 5, (std::uint64_t{1} << 32) - 7,
                                  (std::uint64_t{5} << 32) + 3};
  int combination = 0;
  for (const std::size_t n : {1, 15, 17, 2049, 100003}) {
    for (const State s : kAllStates) {
      for (const DType g : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (int o = 0; o < 3; ++o) {
          for (const bool decoupled : {true, false}) {
            Case r;
            r.n = n;
            r.grads = g;
            r.state = s;
            r.out = o == 2 ? DType::kBF16 : DType::kF16;
            r.with_out = o != 0;
            r.config = decoupled ? config(true, 0.1f) : config(false, 0.05f);
            r.mult = decoupled ? 1.0f : 0.37f;
            r.first_index = firsts[combination++ % 4];
            EXPECT_EQ(run(GetParam(), r), run(Isa::kScalar, r))
                << "n " << n << " state " << state_name(s) << " grads " << zo::dtype_name(g)
                << " out " << o << " decoupled " << decoupled << " first " << r.first_index;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, IsaBf16Master, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& p) {
                           return std::string(zo::cpu_adam::isa_name(p.param));
                         });

// Thread counts and splits never change a bit (q8 splits at blocks, as callers do), also when
// the range crosses an index that is a multiple of 2^32.
TEST(CpuAdamBf16Master, ResultsIndependentOfThreadCountAndSplits) {
  for (const State s : kAllStates) {
    Case r;
    r.n = 5 * 16384 + 999;
    r.grads = DType::kBF16;
    r.state = s;
    r.with_out = true;
    r.first_index = (std::uint64_t{1} << 32) - 40000;
    r.threads = 1;
    const auto want = run(zo::cpu_adam::best_isa(), r);
    const std::vector<std::size_t> splits = s == State::kQ8
                                                ? std::vector<std::size_t>{3 * kQ8Block, 40960}
                                                : std::vector<std::size_t>{12345, 40000, 40001};
    for (const int threads : {2, 5}) {
      for (const bool split : {false, true}) {
        r.threads = threads;
        r.splits = split ? splits : std::vector<std::size_t>{};
        EXPECT_EQ(run(zo::cpu_adam::best_isa(), r), want)
            << state_name(s) << ", " << threads << " threads, split " << split;
      }
    }
  }
}

// The largest bf16 at or below x and the smallest at or above it (x finite, not at the ends).
std::uint16_t bf16_down(double x) {
  std::uint16_t b = zo::float_to_bf16(float(x));
  while (from_bf16(b) > x)
    b = x > 0 ? b - 1 : b + 1;
  return b;
}
std::uint16_t bf16_up(double x) {
  std::uint16_t b = zo::float_to_bf16(float(x));
  while (from_bf16(b) < x)
    b = x > 0 ? b + 1 : b - 1;
  return b;
}

// One step against float64 Adam of the bf16 input: the stored value lies between the bf16
// neighbours of the float64 result (widened by the fp32 arithmetic's few-ulp error).
TEST(CpuAdamBf16Master, IsOneOfTheBf16NeighboursOfTheFloat64Update) {
  const std::size_t n = 20011;
  Problem pr(n, DType::kF32, State::kF32, 3);
  const Problem before = pr;
  const AdamConfig c = config(true, 0.1f);
  CpuAdam::Options o;
  o.isa = Isa::kScalar;
  CpuAdam(c, o).update(pr.buffers(0, n, DType::kBF16, true, 5, 1000), 1);
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr;
  int rounded_up = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = before.g[i];
    const double m = b1 * before.m32[i] + (1 - b1) * g;
    const double v = b2 * before.v32[i] + (1 - b2) * g * g;
    const double p = from_bf16(before.p[i]) * (1 - lr * c.weight_decay) -
                     lr / (1 - b1) * m / (std::sqrt(v) / std::sqrt(1 - b2) + double(c.eps));
    const double slack = 1e-6 * std::fabs(p) + 1e-30;
    const float got = from_bf16(pr.p[i]);
    EXPECT_GE(got, from_bf16(bf16_down(p - slack))) << i;
    EXPECT_LE(got, from_bf16(bf16_up(p + slack))) << i;
    EXPECT_EQ(pr.out[i], pr.p[i]) << "the bf16 copy is the stored master";
    if (std::fabs(got) > std::fabs(p)) ++rounded_up;
  }
  // About half of the values round away from zero (their distances are spread over [0, 1)).
  EXPECT_GT(rounded_up, int(n) * 4 / 10);
  EXPECT_LT(rounded_up, int(n) * 6 / 10);
}

// Over many elements holding the same update, the stored values average to the unrounded one
// within 4 standard deviations: stochastic rounding is unbiased. Through the kernel, and through
// the public rounding with each index's bits.
TEST(CpuAdamBf16Master, RoundingIsUnbiasedOverManyDraws) {
  const std::size_t n = 200000;
  const auto within_4_sigma = [n](const std::vector<std::uint16_t>& stored, float exact) {
    const std::uint16_t lo = bf16_down(exact), hi = bf16_up(exact);
    const double ulp = double(from_bf16(hi)) - double(from_bf16(lo));
    if (ulp == 0) return ::testing::AssertionFailure() << exact << " is a bf16 value";
    const double d = (double(exact) - from_bf16(lo)) / ulp;
    double sum = 0;
    for (const std::uint16_t s : stored) {
      if (s != lo && s != hi) return ::testing::AssertionFailure() << "not a neighbour: " << s;
      sum += from_bf16(s);
    }
    const double mean = sum / double(n), sigma = ulp * std::sqrt(d * (1 - d) / double(n));
    if (std::fabs(mean - exact) <= 4 * sigma) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "mean " << mean << " exact " << exact << " sigma " << sigma;
  };

  // The kernel: every element starts equal, so every unrounded update is the same float.
  Problem pr(n, DType::kF32, State::kF32, 4);
  const std::uint16_t start = zo::float_to_bf16(0.7123f);
  std::fill(pr.p.begin(), pr.p.end(), start);
  std::fill(pr.g.begin(), pr.g.end(), 0.013f);
  std::fill(pr.m32.begin(), pr.m32.end(), 0.0f);
  std::fill(pr.v32.begin(), pr.v32.end(), 0.0f);
  AdamConfig c = config(true, 0.0f);
  c.lr = 1e-3f;
  // Indices across 2^32, where the key of the random bits changes, an odd distance before it.
  const std::uint64_t first = (std::uint64_t{1} << 32) - 50003;
  CpuAdam(c).update(pr.buffers(0, n, DType::kBF16, false, 11, first), 1);
  // The fp32 update of each element (scalar, in the kernel's order): p - lr * m / (sqrt(v)+eps).
  const zo::AdamScalars k = zo::adam_scalars(c, 1, 1.0f);
  const float m = std::fma(k.one_minus_beta1, 0.013f, k.beta1 * 0.0f);
  const float v = std::fma(k.one_minus_beta2, 0.013f * 0.013f, k.beta2 * 0.0f);
  const float denom = std::fma(std::sqrt(v), k.bc2_rsqrt, k.eps);
  const float exact = std::fma(k.neg_step_size, m / denom, from_bf16(start) * k.decay);
  // Less than half a bf16 step: rounding to nearest would never move p at all.
  ASSERT_EQ(zo::float_to_bf16(exact), start);
  EXPECT_TRUE(within_4_sigma(pr.p, exact));
  // Each element drew the public definition's bits: (seed 11, step 1, its index).
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(pr.p[i], bf16_round_stochastic(exact, sr_bits(11, 1, first + i))) << i;

  // The public rounding, at several distances from the bf16 below.
  for (const float x : {1.0f + 0x1p-9f, 1.0f + 0x1p-12f, -3.0f - 0x1.8p-7f, 0.3e-20f}) {
    std::vector<std::uint16_t> stored(n);
    for (std::size_t i = 0; i < n; ++i)
      stored[i] = bf16_round_stochastic(x, sr_bits(2, 7, i));
    EXPECT_TRUE(within_4_sigma(stored, x)) << x;
  }
}

// Chi-square of 16 buckets against uniform, for 4 bits of the 16 used.
double chi_square(const std::vector<std::uint32_t>& bits, int shift) {
  std::vector<double> count(16, 0.0);
  for (const std::uint32_t b : bits)
    count[(b >> shift) & 15] += 1.0;
  const double expect = double(bits.size()) / 16.0;
  double chi = 0;
  for (const double c : count)
    chi += (c - expect) * (c - expect) / expect;
  return chi;
}

TEST(SrBits, UniformOverIndicesStepsAndSeedsAndReproducible) {
  const std::size_t n = 1 << 16;
  std::vector<std::uint32_t> by_index, by_step, by_seed, across_2_32;
  for (std::size_t i = 0; i < n; ++i) {
    by_index.push_back(sr_bits(1, 1, i));
    by_step.push_back(sr_bits(1, std::int64_t(i) + 1, 12345));
    by_seed.push_back(sr_bits(i, 1, 12345));
    across_2_32.push_back(sr_bits(1, 1, (std::uint64_t{1} << 32) - n / 2 + i));
  }
  // 15 degrees of freedom: 60 is far in the tail (p ~ 1e-7), a loose bound for any real bias.
  for (const auto* bits : {&by_index, &by_step, &by_seed, &across_2_32}) {
    for (const int shift : {0, 4, 8, 12})
      EXPECT_LT(chi_square(*bits, shift), 60.0) << "shift " << shift;
  }
  // Different (seed, t) draw different bits for the same indices.
  int same = 0;
  for (std::size_t i = 0; i < n; ++i)
    same += (sr_bits(1, 1, i) & 0xffff) == (sr_bits(1, 2, i) & 0xffff) ? 1 : 0;
  EXPECT_LT(same, 16);
  // Reproducible, and pinned: a resumed run must draw what the interrupted one would have.
  EXPECT_EQ(sr_bits(1, 1, 0), sr_bits(1, 1, 0));
  EXPECT_EQ(sr_bits(0, 1, 0), 1025972629u);
  EXPECT_EQ(sr_bits(42, 1000, 123456789), 3790274454u);
  EXPECT_EQ(sr_bits(~std::uint64_t{0}, 7, (std::uint64_t{3} << 32) + 5), 2161904649u);
}

TEST(SrBits, RoundingOfSpecialValues) {
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  // r = 0 truncates; r = 0xffff rounds up whatever is below the kept half; only the low 16 bits
  // of r count.
  EXPECT_EQ(bf16_round_stochastic(1.0f + 0x1p-10f, 0), 0x3f80);
  EXPECT_EQ(bf16_round_stochastic(1.0f + 0x1p-10f, 0xffff), 0x3f81);
  EXPECT_EQ(bf16_round_stochastic(1.0f, 0xffff), 0x3f80);  // exact values never move
  EXPECT_EQ(bf16_round_stochastic(1.0f + 0x1p-10f, 0xabcd0000u), 0x3f80);
  EXPECT_EQ(bf16_round_stochastic(-1.0f - 0x1p-10f, 0xffff), 0xbf81);  // away from zero
  EXPECT_EQ(bf16_round_stochastic(-0.0f, 0xffff), 0x8000);
  EXPECT_EQ(bf16_round_stochastic(0x1p-140f, 0xffff), (bits(0x1p-140f) + 0xffff) >> 16);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_round_stochastic(inf, 0xffff), 0x7f80);
  EXPECT_EQ(bf16_round_stochastic(-inf, 0xffff), 0xff80);
  EXPECT_EQ(bf16_round_stochastic(std::numeric_limits<float>::max(), 0xffff), 0x7f80);
  // NaN stays a quiet NaN whatever r, even one whose payload is only in the low bits.
  const float nan_low = std::bit_cast<float>(0x7f800001u);
  const float nan_max = std::bit_cast<float>(0xffffffffu);
  EXPECT_EQ(bf16_round_stochastic(nan_low, 0xffff), 0x7fc0);
  EXPECT_EQ(bf16_round_stochastic(nan_max, 0xffff), 0xffff);
}

TEST(CpuAdamBf16Master, RefusesParamsBesideItAndIndexOverflow) {
  Problem pr(100, DType::kF32, State::kF32, 5);
  CpuAdam adam(config(true, 0.0f));
  const auto error = [&](const AdamBuffers& x) {
    try {
      adam.update(x, 1);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::vector<float> fp32(100);
  AdamBuffers x = pr.buffers(0, 100, DType::kBF16, false, 1, 0);
  x.params = fp32;
  EXPECT_NE(error(x).find("replace params; leave params empty"), std::string::npos);
  x = pr.buffers(0, 100, DType::kBF16, false, 1, ~std::uint64_t{0} - 50);
  EXPECT_NE(error(x).find("overflows 64 bits"), std::string::npos);
  x = pr.buffers(0, 100, DType::kBF16, false, 1, 0);
  x.exp_avg.size = 99;
  EXPECT_NE(error(x).find("exp_avg has 99 elements"), std::string::npos);
}

}  // namespace
