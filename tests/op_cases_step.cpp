#include "op_cases_step.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/adam.h"
#include "op_compare.h"

namespace zo::test::step_cases {

using zo::DType;

// ---- reductions --------------------------------------------------------------------------------

void sum_squares(OpRun& r, std::size_t n) {
  const Tensor x = r.rand(n), out = r.f32({1.5f});
  r.dev().sum_squares(out.f(), x.p, n, r.s());
  r.out("sum of squares + 1.5", out, Check::kStats);
}

void nonfinite_flag(OpRun& r) {
  const std::size_t n = 1001;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> finite = r.normal(n, 100.0f);
  auto flag_after = [&](const std::vector<float>& x, float preset, float want,
                        const std::string& what) {
    const Tensor data = r.act(x), flag = r.f32({preset});
    r.dev().nonfinite_flag(flag.f(), data.p, n, r.s());
    EXPECT_EQ(r.out(what, flag, Check::kBits)[0], want) << what;
  };
  flag_after(finite, 0.0f, 0.0f, "finite");
  flag_after(finite, 0.25f, 0.25f, "finite, flag left as it was");
  const std::pair<std::size_t, float> bad[] = {{0, -inf}, {777, inf}, {n - 1, nan}, {500, nan}};
  for (const auto& [index, value] : bad) {
    std::vector<float> x = finite;
    x[index] = value;
    flag_after(x, 0.0f, 1.0f, std::to_string(value) + " at " + std::to_string(index));
  }
}

// ---- cast: every destination dtype from one source dtype, bit for bit ---------------------------

void cast_from(OpRun& r, DType src_t) {
  const std::vector<float> x = round_to(cast_inputs(r.rng()), src_t);
  const Tensor src = r.put(x, src_t);
  for (const DType dst_t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const Tensor dst = r.put(std::vector<float>(x.size(), 0.0f), dst_t);
    r.dev().cast(dst.p, dst_t, src.p, src_t, x.size(), r.s());
    const std::string what = "to " + std::string(zo::dtype_name(dst_t));
    r.out(what, dst, Check::kBits);
    EXPECT_EQ(r.raw(dst), encode(x, dst_t)) << what << ": not the rounding of core/dtype.h";
  }
}

// ---- AdamW: ten steps with fresh gradients ------------------------------------------------------

// With `runs`, weight decay by run table (core/adam.h): the first run at 0, others in [1, n).
// The one launch over the table must equal, bit for bit on the same device, one launch per run
// with the run's own weight decay.
void adamw(OpRun& r, const std::vector<std::uint64_t>& runs) {
  const std::size_t n = 1001;
  const std::vector<float> zeros(n, 0.0f), start = r.normal_f32(n);
  const Tensor master = r.f32(start), m = r.f32(zeros), v = r.f32(zeros);
  const Tensor params = r.act(zeros);
  const Tensor run_master = r.f32(start), run_m = r.f32(zeros), run_v = r.f32(zeros);
  const zo::AdamConfig c{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  const float grad_mult = 0.5f;
  const Tensor table = r.u64(runs.empty() ? std::vector<std::uint64_t>{0} : runs);
  const auto* starts = runs.empty() ? nullptr : static_cast<const std::uint64_t*>(table.p);
  for (std::int64_t k = 1; k <= 10; ++k) {
    const Tensor g = r.rand(n);
    r.dev().adamw(master.f(), m.f(), v.f(), g.p, params.p, n, c, k, grad_mult, starts,
                  static_cast<int>(runs.size()), nullptr, r.s());
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const std::size_t b = runs[i] & ~zo::kAdamRunDecays;
      const std::size_t e = i + 1 < runs.size() ? runs[i + 1] & ~zo::kAdamRunDecays : n;
      zo::AdamConfig rc = c;
      rc.weight_decay = (runs[i] & zo::kAdamRunDecays) != 0 ? c.weight_decay : 0.0f;
      const std::size_t esize = zo::dtype_size(g.t);
      r.dev().adamw(run_master.f() + b, run_m.f() + b, run_v.f() + b,
                    static_cast<const char*>(g.p) + b * esize, nullptr, e - b, rc, k, grad_mult,
                    nullptr, 0, nullptr, r.s());
    }
  }
  const std::vector<float> new_master = r.out("master", master, Check::kStats);
  r.out("m", m, Check::kStats);
  r.out("v", v, Check::kStats);
  EXPECT_EQ(r.raw(params), encode(new_master, params.t)) << "params_out is the new master, rounded";
  if (!runs.empty()) {
    EXPECT_EQ(r.raw(master), r.raw(run_master)) << "the run table against one launch per run";
    EXPECT_EQ(r.raw(m), r.raw(run_m));
    EXPECT_EQ(r.raw(v), r.raw(run_v));
  }
}

// ---- the step's gate, and AdamW behind it ------------------------------------------------------

namespace {

zo::StepGate read_gate(OpRun& r, const Tensor& gate, const std::string& what) {
  r.out(what, gate, Check::kBits);
  zo::StepGate g;
  const std::vector<std::uint8_t> bytes = r.raw(gate);
  std::memcpy(&g, bytes.data(), sizeof g);
  return g;
}

}  // namespace

// The gate on the device against the rule written out here: unscale the norm, clip it as
// torch.nn.utils.clip_grad_norm_ does (max / (norm + 1e-6) when over max), skip on Inf/NaN or
// when forced. Bit for bit: the training loop decides the same step on the host.
void step_gate(OpRun& r) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::pair<float, zo::StepGateRule>> cases = {
      {2.5e7f, {1024.0f, 1.0f, false}},   // norm 4.9: clipped to 1
      {2.5e7f, {1024.0f, 10.0f, false}},  // under the clip
      {2.5e7f, {1024.0f, 0.0f, false}},   // no clipping
      {0.0f, {1.0f, 1.0f, false}},        // a zero gradient
      {0.25f, {1.0f, 0.5f, false}},       // exactly at the clip: not clipped
      {3.0e38f, {1.0f, 1.0f, false}},     // finite and huge
      {inf, {65536.0f, 1.0f, false}},     // an fp16 overflow
      {nan, {1.0f, 0.0f, false}},        {1.0f, {1.0f, 1.0f, true}},  // forced
  };
  for (const float x : r.normal_f32(6))
    cases.push_back({x * x * 1e4f, {std::exp2(std::round(x * 8.0f)), std::fabs(x) + 0.5f, false}});
  for (const auto& [sumsq, rule] : cases) {
    const std::string what = "sumsq " + std::to_string(sumsq) + " scale " +
                             std::to_string(rule.loss_scale) + " max " +
                             std::to_string(rule.max_norm) + (rule.force_skip ? " forced" : "");
    const Tensor in = r.f32({sumsq}), gate = r.u64({~std::uint64_t{0}});
    r.dev().step_gate(static_cast<zo::StepGate*>(gate.p), in.f(), rule, r.s());
    const zo::StepGate got = read_gate(r, gate, what);
    const double norm = std::sqrt(double(sumsq)) / double(rule.loss_scale);
    const bool skip = rule.force_skip || !std::isfinite(norm);
    EXPECT_EQ(got.skip != 0, skip) << what;
    if (skip) continue;
    const float clip = rule.max_norm > 0.0f && norm > double(rule.max_norm)
                           ? float(double(rule.max_norm) / (norm + 1e-6))
                           : 1.0f;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got.grad_mult),
              std::bit_cast<std::uint32_t>(clip / rule.loss_scale))
        << what;
  }
}

// AdamW reading its multiplier from a device gate equals AdamW given it, bit for bit; a gate
// that says skip leaves master, m, v and the parameters as they were.
void adamw_gated(OpRun& r) {
  const std::size_t n = 1001;
  const std::vector<float> start = r.normal_f32(n), m0 = r.normal_f32(n);
  std::vector<float> v0 = r.normal_f32(n);
  for (float& x : v0)
    x *= x;
  const zo::AdamConfig c{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f};
  const Tensor g = r.rand(n), sumsq = r.f32({900.0f});
  const zo::StepGateRule rule{8.0f, 1.0f, false};  // norm 3.75, clipped
  const Tensor gate = r.u64({0});
  auto* gp = static_cast<zo::StepGate*>(gate.p);
  r.dev().step_gate(gp, sumsq.f(), rule, r.s());
  const zo::StepGate want = zo::step_gate(900.0, rule);
  EXPECT_EQ(read_gate(r, gate, "gate").grad_mult, want.grad_mult);
  const Tensor master = r.f32(start), m = r.f32(m0), v = r.f32(v0), params = r.act(start);
  const Tensor plain_master = r.f32(start), plain_m = r.f32(m0), plain_v = r.f32(v0);
  r.dev().adamw(master.f(), m.f(), v.f(), g.p, params.p, n, c, 3, 1.0f, nullptr, 0, gp, r.s());
  r.dev().adamw(plain_master.f(), plain_m.f(), plain_v.f(), g.p, nullptr, n, c, 3, want.grad_mult,
                nullptr, 0, nullptr, r.s());
  r.out("master", master, Check::kStats);
  EXPECT_EQ(r.raw(master), r.raw(plain_master)) << "the gate's multiplier against the argument";
  EXPECT_EQ(r.raw(m), r.raw(plain_m));
  EXPECT_EQ(r.raw(v), r.raw(plain_v));

  const Tensor skip_gate = r.u64({0}), forced = r.f32({900.0f});
  auto* sp = static_cast<zo::StepGate*>(skip_gate.p);
  r.dev().step_gate(sp, forced.f(), {8.0f, 1.0f, true}, r.s());
  const Tensor kept = r.f32(start), kept_m = r.f32(m0), kept_v = r.f32(v0), kept_p = r.act(start);
  const std::vector<std::uint8_t> params_before = r.raw(kept_p);
  r.dev().adamw(kept.f(), kept_m.f(), kept_v.f(), g.p, kept_p.p, n, c, 3, 1.0f, nullptr, 0, sp,
                r.s());
  EXPECT_EQ(r.get(kept), start) << "a skipped step changed the master weights";
  EXPECT_EQ(r.get(kept_m), m0);
  EXPECT_EQ(r.get(kept_v), v0);
  EXPECT_EQ(r.raw(kept_p), params_before) << "a skipped step changed the parameters";
}

}  // namespace zo::test::step_cases
