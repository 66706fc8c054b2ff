// CPU Adam: every ISA path bit for bit against an independent scalar float reference, and within
// tolerance against a float64 reference, over 100+ steps on random data of odd sizes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "ref_16bit.h"

namespace {

using zo::AdamConfig;
using zo::DType;
using zo::cpu_adam::AdamBuffers;
using zo::cpu_adam::AdamState;
using zo::cpu_adam::CpuAdam;
using zo::cpu_adam::Isa;
using zo::cpu_adam::NonFinitePolicy;
using zo::cpu_adam::StepOptions;

constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16};
constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

using zo::test::ref_from_bf16;
using zo::test::ref_from_f16;
using zo::test::ref_to_bf16;
using zo::test::ref_to_f16;

float decode(DType t, const void* base, std::size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return ref_from_f16(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kBF16:
      return ref_from_bf16(static_cast<const std::uint16_t*>(base)[i]);
  }
  return 0.0f;
}

// ---- a problem: arrays in the library's dtypes, misaligned by `offset` elements ----------------
struct Problem {
  DType grad_t, state_t, out_t;
  bool has_out;
  std::size_t n, offset;
  std::vector<float> p;
  std::vector<std::uint32_t> m_raw, v_raw, g_raw, out_raw;  // 4-byte words hold either dtype

  Problem(std::size_t n_, DType g, DType s, bool has_out_, DType o, std::size_t offset_)
      : grad_t(g),
        state_t(s),
        out_t(o),
        has_out(has_out_),
        n(n_),
        offset(offset_),
        p(n + offset),
        m_raw(n + offset),
        v_raw(n + offset),
        g_raw(n + offset),
        out_raw(n + offset) {}

  void* at(std::vector<std::uint32_t>& raw, DType t) {
    return t == DType::kF32
               ? static_cast<void*>(reinterpret_cast<float*>(raw.data()) + offset)
               : static_cast<void*>(reinterpret_cast<std::uint16_t*>(raw.data()) + offset);
  }
  float* params() { return p.data() + offset; }
  void* m() { return at(m_raw, state_t); }
  void* v() { return at(v_raw, state_t); }
  void* g() { return at(g_raw, grad_t); }
  void* out() { return at(out_raw, out_t); }

  void set(DType t, void* base, std::size_t i, float x) {
    if (t == DType::kF32) static_cast<float*>(base)[i] = x;
    if (t == DType::kF16) static_cast<std::uint16_t*>(base)[i] = ref_to_f16(x);
    if (t == DType::kBF16) static_cast<std::uint16_t*>(base)[i] = ref_to_bf16(x);
  }

  AdamBuffers buffers() {
    AdamBuffers b;
    b.params = {params(), n};
    b.exp_avg = {m(), n, state_t};
    b.exp_avg_sq = {v(), n, state_t};
    b.grads = {g(), n, grad_t};
    if (has_out) b.params_out = {out(), n, out_t};
    return b;
  }
};

// Magnitudes from 1e-7 to 1e5 so that fp16 outputs see subnormals and overflow.
void init_state(Problem& pr, std::mt19937& rng, bool wide_params) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-7.0f, 5.0f);
  for (std::size_t i = 0; i < pr.n; ++i) {
    pr.params()[i] = normal(rng) * (wide_params ? std::pow(10.0f, exponent(rng)) : 1.0f);
    pr.set(pr.state_t, pr.m(), i, 0.01f * normal(rng));
    pr.set(pr.state_t, pr.v(), i, 1e-4f * std::fabs(normal(rng)));
  }
}

void fill_grads(Problem& pr, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-4.0f, 1.0f);
  for (std::size_t i = 0; i < pr.n; ++i) {
    pr.set(pr.grad_t, pr.g(), i, normal(rng) * std::pow(10.0f, exponent(rng)));
  }
}

// ---- scalar float reference: the documented formula, element by element ----------------------
struct RefState {
  std::vector<float> p, m, v;
  std::vector<std::uint16_t> out;
};

RefState snapshot(Problem& pr) {
  RefState r;
  for (std::size_t i = 0; i < pr.n; ++i) {
    r.p.push_back(pr.params()[i]);
    r.m.push_back(decode(pr.state_t, pr.m(), i));
    r.v.push_back(decode(pr.state_t, pr.v(), i));
  }
  r.out.resize(pr.n);
  return r;
}

void reference_step(const AdamConfig& c, std::int64_t t, float mult, Problem& pr, RefState& r) {
  const double b1 = c.beta1, b2 = c.beta2;
  const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, double(t)) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, double(t)) : 1.0;
  const auto omb1 = static_cast<float>(1.0 - b1), omb2 = static_cast<float>(1.0 - b2);
  const auto neg_step = static_cast<float>(-double{c.lr} / bc1);
  const auto bc2_rsqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const bool l2 = !c.decoupled_weight_decay && c.weight_decay != 0.0f;
  const float decay =
      c.decoupled_weight_decay ? static_cast<float>(1.0 - double{c.lr} * c.weight_decay) : 1.0f;
  for (std::size_t i = 0; i < pr.n; ++i) {
    float g = decode(pr.grad_t, pr.g(), i) * mult;
    if (l2) g = std::fma(c.weight_decay, r.p[i], g);
    const float m = std::fma(omb1, g, c.beta1 * r.m[i]);
    const float v = std::fma(omb2, g * g, c.beta2 * r.v[i]);
    const float denom = std::fma(std::sqrt(v), bc2_rsqrt, c.eps);
    r.p[i] = std::fma(neg_step, m / denom, r.p[i] * decay);
    r.m[i] = pr.state_t == DType::kBF16 ? ref_from_bf16(ref_to_bf16(m)) : m;
    r.v[i] = pr.state_t == DType::kBF16 ? ref_from_bf16(ref_to_bf16(v)) : v;
    r.out[i] = pr.out_t == DType::kF16 ? ref_to_f16(r.p[i]) : ref_to_bf16(r.p[i]);
  }
}

std::uint32_t bits(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

void expect_bit_equal(Problem& pr, const RefState& r, const std::string& where) {
  for (std::size_t i = 0; i < pr.n; ++i) {
    ASSERT_EQ(bits(pr.params()[i]), bits(r.p[i]))
        << where << " param " << i << ": " << pr.params()[i] << " vs " << r.p[i];
    ASSERT_EQ(bits(decode(pr.state_t, pr.m(), i)), bits(r.m[i])) << where << " m " << i;
    ASSERT_EQ(bits(decode(pr.state_t, pr.v(), i)), bits(r.v[i])) << where << " v " << i;
    if (pr.has_out) {
      ASSERT_EQ(static_cast<const std::uint16_t*>(pr.out())[i], r.out[i]) << where << " out " << i;
    }
  }
}

std::string describe(Isa isa, const Problem& pr, const AdamConfig& c, float mult) {
  return std::string(zo::cpu_adam::isa_name(isa)) + " n=" + std::to_string(pr.n) +
         " grad=" + std::string(zo::dtype_name(pr.grad_t)) +
         " state=" + std::string(zo::dtype_name(pr.state_t)) +
         " out=" + (pr.has_out ? std::string(zo::dtype_name(pr.out_t)) : "none") +
         (c.decoupled_weight_decay ? " adamw" : " adam-l2") +
         " wd=" + std::to_string(c.weight_decay) + (c.bias_correction ? " bc" : " no-bc") +
         " mult=" + std::to_string(mult);
}

// Runs `steps` updates on the library and the reference and compares every bit at the end.
void run_bit_exact(Isa isa, std::size_t n, DType g, DType s, bool has_out, DType o,
                   const AdamConfig& c, float mult, int steps, std::uint32_t seed,
                   std::size_t offset = 1, int threads = 2) {
  std::mt19937 rng(seed);
  Problem pr(n, g, s, has_out, o, offset);
  init_state(pr, rng, /*wide_params=*/true);
  RefState ref = snapshot(pr);
  CpuAdam::Options opt;
  opt.isa = isa;
  opt.threads = threads;
  CpuAdam adam(c, opt);
  AdamState state;
  for (int step = 0; step < steps; ++step) {
    fill_grads(pr, rng);
    reference_step(c, state.step + 1, mult, pr, ref);
    const auto res = adam.step(pr.buffers(), state, {mult, NonFinitePolicy::kReport});
    ASSERT_TRUE(res.applied);
    ASSERT_FALSE(res.found_nonfinite);
  }
  ASSERT_EQ(state.step, steps);
  expect_bit_equal(pr, ref, describe(isa, pr, c, mult));
}

AdamConfig config(bool decoupled, bool bias_correction, float wd) {
  AdamConfig c;
  c.lr = 3e-3f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = wd;
  c.decoupled_weight_decay = decoupled;
  c.bias_correction = bias_correction;
  return c;
}

class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!zo::cpu_adam::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << zo::cpu_adam::isa_name(GetParam()) << " path";
    }
  }
};

// Every grad/state/out dtype combination, weight decay on/off (decoupled and L2), bias correction
// on/off, multipliers != 1, sizes around the vector widths.
TEST_P(IsaTest, AllDtypeCombinationsBitExact) {
  std::uint32_t seed = 1;
  for (DType g : kAllDTypes) {
    for (DType s : {DType::kF32, DType::kBF16}) {
      for (int out = 0; out < 3; ++out) {
        const bool has_out = out != 0;
        const DType o = out == 2 ? DType::kBF16 : DType::kF16;
        for (std::size_t n : {1u, 15u, 16u, 17u, 1021u}) {
          run_bit_exact(GetParam(), n, g, s, has_out, o, config(true, true, 0.1f), 1.0f, 101,
                        seed++);
          run_bit_exact(GetParam(), n, g, s, has_out, o, config(false, true, 0.05f), 0.37f, 101,
                        seed++);
          run_bit_exact(GetParam(), n, g, s, has_out, o, config(true, false, 0.0f), 0x1p-10f, 101,
                        seed++);
        }
      }
    }
  }
}

TEST_P(IsaTest, OddSizesUpToAMillionBitExact) {
  const std::size_t sizes[] = {2,  3,  5,   7,    8,     9,     31,    32,    33,    63,
                               64, 65, 127, 4099, 16383, 16384, 16385, 65537, 131071};
  std::uint32_t seed = 100;
  for (std::size_t n : sizes) {
    run_bit_exact(GetParam(), n, DType::kF16, DType::kBF16, true, DType::kBF16,
                  config(true, true, 0.1f), 0.5f, 101, seed++, n % 3);
  }
  run_bit_exact(GetParam(), 1000003, DType::kBF16, DType::kF32, true, DType::kF16,
                config(true, true, 0.1f), 1.0f, 101, 7, /*offset=*/3);
}

// bf16 state with subnormal moments exercises the AVX512-BF16 fix-up path.
TEST_P(IsaTest, SubnormalStateRoundsLikeScalar) {
  std::mt19937 rng(5);
  Problem pr(4099, DType::kF32, DType::kBF16, true, DType::kBF16, 0);
  init_state(pr, rng, false);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < pr.n; ++i) {
    pr.set(DType::kBF16, pr.m(), i, 1e-39f * normal(rng));
    pr.set(DType::kBF16, pr.v(), i, 0.0f);
    static_cast<float*>(pr.g())[i] = 1e-38f * normal(rng);  // fp32 subnormal region after b1 decay
  }
  RefState ref = snapshot(pr);
  CpuAdam::Options opt;
  opt.isa = GetParam();
  CpuAdam adam(config(true, true, 0.0f), opt);
  AdamState st;
  for (int step = 0; step < 3; ++step) {
    reference_step(adam.config(), st.step + 1, 1.0f, pr, ref);
    adam.step(pr.buffers(), st);
  }
  int subnormal_m = 0;
  for (float m : ref.m)
    subnormal_m += std::fpclassify(m) == FP_SUBNORMAL;
  EXPECT_GT(subnormal_m, 100) << "the test must produce subnormal bf16 moments";
  expect_bit_equal(pr, ref, "subnormal state");
}

// Float64 reference: the same algorithm in double; fp32 rounding stays within tolerance over
// 101 steps.
void run_against_float64(Isa isa, DType s, const AdamConfig& c, float mult) {
  const std::size_t n = 4099;
  const int steps = 101;
  std::mt19937 rng(42);
  Problem pr(n, DType::kF32, s, false, DType::kF16, 0);
  init_state(pr, rng, false);
  std::vector<double> p(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = pr.params()[i];
    m[i] = decode(s, pr.m(), i);
    v[i] = decode(s, pr.v(), i);
  }
  CpuAdam::Options opt;
  opt.isa = isa;
  CpuAdam adam(c, opt);
  AdamState st;
  double grad_rms = 0.0;
  for (int step = 1; step <= steps; ++step) {
    fill_grads(pr, rng);
    const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay;
    const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, step) : 1.0;
    const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, step) : 1.0;
    for (std::size_t i = 0; i < n; ++i) {
      double g = double{static_cast<float*>(pr.g())[i]} * mult;
      grad_rms += g * g;
      if (!c.decoupled_weight_decay) g += wd * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      if (s == DType::kBF16) {  // the stored moments are bf16 in this configuration
        m[i] = ref_from_bf16(ref_to_bf16(static_cast<float>(m[i])));
        v[i] = ref_from_bf16(ref_to_bf16(static_cast<float>(v[i])));
      }
      const double decay = c.decoupled_weight_decay ? 1.0 - lr * wd : 1.0;
      p[i] = p[i] * decay - lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + c.eps);
    }
    adam.step(pr.buffers(), st, {mult, NonFinitePolicy::kReport});
  }
  grad_rms = std::sqrt(grad_rms / (double(n) * steps));
  // fp32: a few ulp per step; bf16 state: a stored moment can round one bf16 ulp (2^-8) apart.
  const double p_rel = 2e-6, lr_steps = double{c.lr} * steps;
  const double p_abs = s == DType::kF32 ? 1e-5 * lr_steps : 2e-2 * lr_steps;
  const double mv_rel = s == DType::kF32 ? 1e-4 : 2e-2;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double dp = std::fabs(pr.params()[i] - p[i]);
    worst = std::max(worst, dp / (p_rel * std::fabs(p[i]) + p_abs));
    ASSERT_LE(dp, p_rel * std::fabs(p[i]) + p_abs) << "param " << i;
    ASSERT_LE(std::fabs(decode(s, pr.m(), i) - m[i]), mv_rel * (std::fabs(m[i]) + 1e-3 * grad_rms))
        << "m " << i;
    ASSERT_LE(std::fabs(decode(s, pr.v(), i) - v[i]),
              mv_rel * (std::fabs(v[i]) + 1e-6 * grad_rms * grad_rms))
        << "v " << i;
  }
  // The reference really moved the parameters: the comparison is not against a no-op.
  double moved = 0.0;
  std::mt19937 rng0(42);
  Problem pr0(n, DType::kF32, s, false, DType::kF16, 0);
  init_state(pr0, rng0, false);
  for (std::size_t i = 0; i < n; ++i)
    moved = std::max(moved, std::fabs(pr0.params()[i] - p[i]));
  EXPECT_GT(moved, 0.1 * lr_steps);
  ::testing::Test::RecordProperty("worst_fraction_of_tolerance", std::to_string(worst));
}

TEST_P(IsaTest, MatchesFloat64ReferenceFp32State) {
  run_against_float64(GetParam(), DType::kF32, config(true, true, 0.1f), 1.0f);
  run_against_float64(GetParam(), DType::kF32, config(false, true, 0.01f), 0.25f);
  run_against_float64(GetParam(), DType::kF32, config(true, false, 0.0f), 1.0f);
}

TEST_P(IsaTest, MatchesFloat64ReferenceBf16State) {
  run_against_float64(GetParam(), DType::kBF16, config(true, true, 0.1f), 1.0f);
}

// Non-finite gradients: reported by the fused pass; with kSkipStep nothing changes.
TEST_P(IsaTest, NonFiniteGradients) {
  const float bad_values[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
  for (DType g : kAllDTypes) {
    for (std::size_t n : {1u, 17u, 40000u}) {
      for (float bad : bad_values) {
        std::mt19937 rng(static_cast<std::uint32_t>(n));
        Problem pr(n, g, DType::kF32, true, DType::kF16, 1);
        init_state(pr, rng, false);
        fill_grads(pr, rng);
        const std::size_t where = std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
        pr.set(g, pr.g(), where, bad);
        const std::vector<float> p0(pr.p);
        const std::vector<std::uint32_t> m0(pr.m_raw), v0(pr.v_raw), out0(pr.out_raw);
        CpuAdam::Options opt;
        opt.isa = GetParam();
        CpuAdam adam(config(true, true, 0.1f), opt);

        EXPECT_TRUE(adam.has_nonfinite(pr.buffers().grads));
        AdamState st{5};
        auto r = adam.step(pr.buffers(), st, {1.0f, NonFinitePolicy::kSkipStep});
        EXPECT_TRUE(r.found_nonfinite);
        EXPECT_FALSE(r.applied);
        EXPECT_EQ(st.step, 5);
        EXPECT_EQ(pr.p, p0);
        EXPECT_EQ(pr.m_raw, m0);
        EXPECT_EQ(pr.v_raw, v0);
        EXPECT_EQ(pr.out_raw, out0);

        r = adam.step(pr.buffers(), st, {1.0f, NonFinitePolicy::kReport});
        EXPECT_TRUE(r.found_nonfinite) << zo::cpu_adam::isa_name(GetParam()) << " n=" << n;
        EXPECT_TRUE(r.applied);
        EXPECT_EQ(st.step, 6);
      }
    }
  }
}

TEST_P(IsaTest, MultiplierOverflowIsNonFinite) {
  Problem pr(33, DType::kF32, DType::kF32, false, DType::kF16, 0);
  std::mt19937 rng(3);
  init_state(pr, rng, false);
  fill_grads(pr, rng);
  static_cast<float*>(pr.g())[32] = 3e38f;  // finite, but 3e38 * 4 overflows
  CpuAdam::Options opt;
  opt.isa = GetParam();
  CpuAdam adam(config(true, true, 0.0f), opt);
  EXPECT_FALSE(adam.has_nonfinite(pr.buffers().grads, 1.0f));
  EXPECT_TRUE(adam.has_nonfinite(pr.buffers().grads, 4.0f));
  AdamState st;
  EXPECT_FALSE(adam.step(pr.buffers(), st, {4.0f, NonFinitePolicy::kSkipStep}).applied);
  const auto r = adam.step(pr.buffers(), st, {1.0f, NonFinitePolicy::kSkipStep});
  EXPECT_TRUE(r.applied);
  EXPECT_FALSE(r.found_nonfinite);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, IsaTest, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<Isa>& p) {
                           return std::string(zo::cpu_adam::isa_name(p.param));
                         });

// ---- threading, chunking, buckets ---------------------------------------------------------------
TEST(CpuAdam, ResultsIndependentOfThreadCountAndBucketSplit) {
  const std::size_t n = 300007;  // 19 chunks, the last one partial
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 5}) {
    for (std::size_t split : {std::size_t{0}, std::size_t{12345}, std::size_t{16384 * 7 + 3}}) {
      std::mt19937 rng(11);
      Problem pr(n, DType::kBF16, DType::kBF16, true, DType::kBF16, 0);
      init_state(pr, rng, true);
      CpuAdam::Options opt;
      opt.threads = threads;
      CpuAdam adam(config(true, true, 0.1f), opt);
      EXPECT_EQ(adam.threads(), threads);
      for (std::int64_t t = 1; t <= 5; ++t) {
        fill_grads(pr, rng);
        AdamBuffers all = pr.buffers();
        if (split == 0) {
          adam.update(all, t);
        } else {  // two buckets, updated separately with the same step number
          auto part = [&](std::size_t b, std::size_t e) {
            AdamBuffers x;
            x.params = all.params.subspan(b, e - b);
            x.exp_avg = {static_cast<std::uint16_t*>(all.exp_avg.data) + b, e - b, DType::kBF16};
            x.exp_avg_sq = {static_cast<std::uint16_t*>(all.exp_avg_sq.data) + b, e - b,
                            DType::kBF16};
            x.grads = {static_cast<const std::uint16_t*>(all.grads.data) + b, e - b, DType::kBF16};
            x.params_out = {static_cast<std::uint16_t*>(all.params_out.data) + b, e - b,
                            DType::kBF16};
            return x;
          };
          adam.update(part(split, n), t);
          adam.update(part(0, split), t);
        }
      }
      std::vector<float> flat(pr.p);
      for (std::uint32_t w : pr.m_raw)
        flat.push_back(std::bit_cast<float>(w));
      for (std::uint32_t w : pr.out_raw)
        flat.push_back(std::bit_cast<float>(w));
      results.push_back(std::move(flat));
    }
  }
  for (std::size_t i = 1; i < results.size(); ++i) {
    ASSERT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * 4), 0)
        << "run " << i;
  }
}

TEST(CpuAdam, EmptyArraysAreANoOp) {
  CpuAdam adam(AdamConfig{});
  AdamState st;
  const auto r = adam.step(AdamBuffers{}, st);
  EXPECT_TRUE(r.applied);
  EXPECT_EQ(st.step, 1);
}

// ---- bad arguments --------------------------------------------------------------------------
template <class Fn>
void expect_invalid(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected std::invalid_argument mentioning '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CpuAdam, RejectsBadConfig) {
  auto make = [](auto mutate) {
    return [mutate] {
      AdamConfig c;
      mutate(c);
      CpuAdam adam(c);
    };
  };
  expect_invalid(make([](AdamConfig& c) { c.lr = -1e-3f; }), "lr");
  expect_invalid(make([](AdamConfig& c) { c.lr = std::numeric_limits<float>::quiet_NaN(); }), "lr");
  expect_invalid(make([](AdamConfig& c) { c.beta1 = 1.0f; }), "beta1");
  expect_invalid(make([](AdamConfig& c) { c.beta2 = -0.1f; }), "beta2");
  expect_invalid(make([](AdamConfig& c) { c.eps = 0.0f; }), "eps");
  expect_invalid(make([](AdamConfig& c) { c.weight_decay = -0.1f; }), "weight_decay");
  CpuAdam adam(AdamConfig{});
  expect_invalid([&] { adam.set_lr(-2.0f); }, "lr");
  expect_invalid(
      [] {
        CpuAdam::Options o;
        o.threads = -3;
        CpuAdam a(AdamConfig{}, o);
      },
      "threads");
}

TEST(CpuAdam, RejectsBadBuffers) {
  Problem pr(10, DType::kF16, DType::kF32, true, DType::kBF16, 0);
  CpuAdam adam(AdamConfig{});
  auto with = [&](auto mutate) {
    return [&, mutate] {
      AdamBuffers b = pr.buffers();
      mutate(b);
      AdamState st;
      adam.step(b, st);
    };
  };
  expect_invalid(with([](AdamBuffers& b) { b.exp_avg.data = nullptr; }), "exp_avg is a null");
  expect_invalid(with([](AdamBuffers& b) { b.grads.data = nullptr; }), "grads is a null");
  expect_invalid(with([](AdamBuffers& b) {
                   b.params = {static_cast<float*>(nullptr), 10};
                 }),
                 "params is a null");
  expect_invalid(with([](AdamBuffers& b) { b.grads.size = 9; }), "grads has 9 elements");
  expect_invalid(with([](AdamBuffers& b) { b.params_out.size = 11; }), "params_out has 11");
  expect_invalid(with([](AdamBuffers& b) { b.exp_avg.dtype = DType::kBF16; }), "both must be");
  expect_invalid(with([](AdamBuffers& b) {
                   b.exp_avg.dtype = DType::kF16;
                   b.exp_avg_sq.dtype = DType::kF16;
                 }),
                 "fp16 optimizer state");
  expect_invalid(with([](AdamBuffers& b) { b.params_out.dtype = DType::kF32; }), "params_out");
  expect_invalid([&] { adam.update(pr.buffers(), 0); }, "step t = 0");
  expect_invalid([&] { adam.update(pr.buffers(), 1, {-1.0f}); }, "grad_multiplier");
  expect_invalid([&] { adam.update(pr.buffers(), 1, {std::numeric_limits<float>::infinity()}); },
                 "grad_multiplier");
}

TEST(CpuAdam, IsaSelection) {
  EXPECT_EQ(zo::cpu_adam::parse_isa("avx2"), Isa::kAvx2);
  EXPECT_THROW(zo::cpu_adam::parse_isa("sse9"), std::invalid_argument);
  EXPECT_TRUE(zo::cpu_adam::isa_supported(Isa::kScalar));
  EXPECT_EQ(zo::cpu_adam::supported_isas().front(), Isa::kScalar);
  ASSERT_EQ(setenv("ZO_CPU_ADAM_ISA", "scalar", 1), 0);
  EXPECT_EQ(zo::cpu_adam::default_isa(), Isa::kScalar);
  EXPECT_EQ(CpuAdam(AdamConfig{}).isa(), Isa::kScalar);
  ASSERT_EQ(setenv("ZO_CPU_ADAM_ISA", "bogus", 1), 0);
  EXPECT_THROW(zo::cpu_adam::default_isa(), std::invalid_argument);
  ASSERT_EQ(unsetenv("ZO_CPU_ADAM_ISA"), 0);
  EXPECT_EQ(zo::cpu_adam::default_isa(), zo::cpu_adam::best_isa());
}

}  // namespace
