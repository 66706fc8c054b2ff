// The op-case table (op_cases.h): one function per op that draws its inputs and records its
// outputs, and op_cases(), which lists the shapes each op runs at. Outputs an op writes start
// from random junk (every element must be written); gradients it accumulates start from random
// values (+= onto them). Padded rows (a row stride past the last column) hold NaN in inputs, so
// that reading them shows, and junk in outputs, which must stay as it was.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/adam.h"
#include "op_cases.h"
#include "op_cases_step.h"
#include "op_compare.h"

namespace zo::test {
namespace {

using zo::DType;

// "_N26": one dimension of a case name.
template <class Int>
std::string dim(const char* name, Int size) {
  std::string s = "_";  // appended piecewise: g++ 12 warns falsely (-Wrestrict) on "_" + ...
  s += name;
  s += std::to_string(size);
  return s;
}

// ---- embedding ---------------------------------------------------------------------------------

std::vector<std::int32_t> tokens_with_repeats(OpRun& r, std::size_t n, int V) {
  std::vector<std::int32_t> tok = r.ids(n, V);
  tok[7 % n] = tok[0];  // repeated tokens accumulate into one wte row
  tok[20 % n] = tok[0];
  return tok;
}

// positions: GPT-2's learned position table wpe; without it (Llama) wpe is null.
void embedding_forward(OpRun& r, int B, int T, int C, int V, bool positions) {
  const std::size_t BT = std::size_t(B) * T;
  const Tensor tok = r.i32(tokens_with_repeats(r, BT, V));
  const Tensor wte = r.rand(std::size_t(V) * C), wpe = r.rand(std::size_t(T) * C);
  const Tensor out = r.rand(BT * C);
  r.dev().embedding_forward(out.p, tok.i(), wte.p, positions ? wpe.p : nullptr, B, T, C, r.s());
  r.out("out", out, Check::kAct);
}

void embedding_backward(OpRun& r, int B, int T, int C, int V, bool positions) {
  const std::size_t BT = std::size_t(B) * T;
  const Tensor tok = r.i32(tokens_with_repeats(r, BT, V)), dout = r.rand(BT * C);
  const Tensor dwte = r.rand(std::size_t(V) * C), dwpe = r.rand(std::size_t(T) * C);
  r.dev().embedding_backward(dwte.p, positions ? dwpe.p : nullptr, dout.p, tok.i(), B, T, C, r.s());
  r.out("dwte", dwte, Check::kAct);
  r.out("dwpe", dwpe, Check::kAct);  // unchanged without positions
}

// ---- layernorm and RMSNorm: the backward reads the reference's statistics -----------------------

// A norm's backward(dinp, dresidual) three ways: dresidual in place (the residual stream's
// gradient, accumulated), null (dinp written) and separate. `grads` are the parameter gradients
// it accumulates, recorded after the first call and after all three.
void norm_backward_three_ways(OpRun& r, std::size_t NC,
                              const std::function<void(const Tensor&, const void*)>& backward,
                              std::initializer_list<std::pair<const char*, Tensor>> grads) {
  const Tensor dinp = r.rand(NC);
  backward(dinp, dinp.p);
  r.out("dinp (residual in place)", dinp, Check::kAct);
  for (const auto& [name, g] : grads)
    r.out(name, g, Check::kAct);
  const Tensor written = r.rand(NC), separate = r.rand(NC), dres = r.rand(NC);
  backward(written, nullptr);
  r.out("dinp (written)", written, Check::kAct);
  backward(separate, dres.p);
  r.out("dinp (separate residual)", separate, Check::kAct);
  for (const auto& [name, g] : grads)
    r.out(std::string(name) + " (three calls)", g, Check::kAct);
}

void layernorm(OpRun& r, int N, int C) {
  const std::size_t NC = std::size_t(N) * C;
  const Tensor inp = r.rand(NC, 2.0f, 0.5f), w = r.rand(C, 0.5f, 1.0f), b = r.rand(C, 0.5f);
  const Tensor out = r.rand(NC);
  const Tensor mean = r.f32(std::vector<float>(N, -1.0f)),
               rstd = r.f32(std::vector<float>(N, -1.0f));
  r.dev().layernorm_forward(out.p, mean.f(), rstd.f(), inp.p, w.p, b.p, N, C, r.s());
  r.out("out", out, Check::kAct);
  r.out("mean", mean, Check::kStats);
  r.out("rstd", rstd, Check::kStats);
  const Tensor m = r.from_reference("mean"), rs = r.from_reference("rstd");
  const Tensor dout = r.rand(NC), dw = r.rand(C), db = r.rand(C);
  norm_backward_three_ways(r, NC,
                           [&](const Tensor& d, const void* dres) {
                             r.dev().layernorm_backward(d.p, dres, dw.p, db.p, dout.p, inp.p, w.p,
                                                        m.f(), rs.f(), N, C, r.s());
                           },
                           {{"dweight", dw}, {"dbias", db}});
}

// The fused op, and on the same device the two ops it fuses: the same bits.
void residual_layernorm(OpRun& r, int N, int C) {
  const std::size_t NC = std::size_t(N) * C;
  const Tensor a = r.rand(NC, 2.0f, 0.5f), b = r.rand(NC), w = r.rand(C, 0.5f, 1.0f);
  const Tensor bias = r.rand(C, 0.5f), res = r.rand(NC), out = r.rand(NC);
  auto stats = [&] { return r.f32(std::vector<float>(N, -1.0f)); };
  const Tensor mean = stats(), rstd = stats();
  r.dev().residual_layernorm_forward(res.p, out.p, mean.f(), rstd.f(), a.p, b.p, w.p, bias.p, N, C,
                                     r.s());
  r.out("res", res, Check::kAct);
  r.out("out", out, Check::kAct);
  // Statistics of res as stored: in 16-bit storage a rounding away from the host's fp32 res.
  r.out("mean", mean, Check::kAct);
  r.out("rstd", rstd, Check::kAct);
  const Tensor res2 = r.rand(NC), out2 = r.rand(NC), mean2 = stats(), rstd2 = stats();
  r.dev().residual_forward(res2.p, a.p, b.p, NC, r.s());
  r.dev().layernorm_forward(out2.p, mean2.f(), rstd2.f(), res2.p, w.p, bias.p, N, C, r.s());
  EXPECT_EQ(r.raw(res2), r.raw(res)) << "residual_forward";
  EXPECT_EQ(r.raw(out2), r.raw(out)) << "layernorm_forward after residual_forward";
  EXPECT_EQ(r.raw(mean2), r.raw(mean)) << "mean";
  EXPECT_EQ(r.raw(rstd2), r.raw(rstd)) << "rstd";
}

// ---- matmul: with a row stride (a.ld_out > OC), out's padding must stay as it was and dout's
// (NaN) must not be read -----------------------------------------------------------------------

std::size_t row_stride(const zo::dev::MatmulArgs& a) {
  return std::size_t(a.ld_out != 0 ? a.ld_out : a.OC);
}

// N rows of OC values `ld` apart; the padding NaN.
std::vector<float> padded_rows(OpRun& r, std::size_t N, std::size_t OC, std::size_t ld) {
  std::vector<float> x = r.normal(N * ld);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i % ld >= OC) x[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

// The first `cols` of each row, as a packed act tensor (to record an output with NaN padding).
Tensor packed(OpRun& r, const Tensor& x, std::size_t cols, std::size_t ld) {
  const std::vector<float> all = r.get(x);
  std::vector<float> kept;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i % ld < cols) kept.push_back(all[i]);
  }
  return r.act(kept);
}

void expect_padding_kept(OpRun& r, const Tensor& x, const std::vector<float>& before,
                         std::size_t cols, std::size_t ld, const std::string& what) {
  const std::vector<float> after = r.get(x);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    changed += i % ld >= cols && std::memcmp(&after[i], &before[i], sizeof(float)) != 0 ? 1 : 0;
  }
  EXPECT_EQ(changed, 0u) << what << ": elements past the last column were written";
}

void matmul_forward(OpRun& r, zo::dev::MatmulArgs a) {
  const std::size_t N = a.N, C = a.C, OC = a.OC, ld = row_stride(a);
  const Tensor inp = r.rand(N * C), w = r.rand(OC * C, 1.0f / std::sqrt(float(C)));
  const Tensor bias = r.rand(OC, 0.5f), out = r.rand(N * ld), out_no_bias = r.rand(N * ld);
  const std::vector<float> before = r.get(out);
  r.dev().matmul_forward(out.p, inp.p, w.p, bias.p, a, r.s());
  r.out("out (bias)", out, Check::kAct);
  expect_padding_kept(r, out, before, OC, ld, "out");
  r.dev().matmul_forward(out_no_bias.p, inp.p, w.p, nullptr, a, r.s());
  r.out("out (no bias)", out_no_bias, Check::kAct);
}

// dbias starts small: with cuBLASLt's BGRADB the bias gradient is rounded to the storage dtype
// before it is added, so in 16-bit storage the sum carries one more rounding of the gradient's own
// size, which cancellation against a large start value would magnify past act_tol.
void matmul_backward(OpRun& r, zo::dev::MatmulArgs a) {
  const std::size_t N = a.N, C = a.C, OC = a.OC, ld = row_stride(a);
  const Tensor dout = r.act(padded_rows(r, N, OC, ld)), inp = r.rand(N * C);
  const Tensor w = r.rand(OC * C, 1.0f / std::sqrt(float(C)));
  const Tensor dinp = r.rand(N * C), dw = r.rand(OC * C), db = r.rand(OC, 0.1f);
  r.dev().matmul_backward(dinp.p, dw.p, db.p, dout.p, inp.p, w.p, a, r.s());
  r.out("dinp", dinp, Check::kAct);
  r.out("dweight", dw, Check::kAct);
  r.out("dbias", db, Check::kAct);
  const std::vector<std::uint8_t> dbias = r.raw(db);
  const Tensor dinp2 = r.rand(N * C);
  r.dev().matmul_backward(dinp2.p, dw.p, nullptr, dout.p, inp.p, w.p, a, r.s());
  r.out("dinp (second call)", dinp2, Check::kAct);
  r.out("dweight (second call)", dw, Check::kAct);
  EXPECT_EQ(r.raw(db), dbias) << "a null dbias must leave the bias gradient alone";
}

// pre = inp @ w^T + bias and out = gelu(pre), with and without bias.
void matmul_gelu_forward(OpRun& r, zo::dev::MatmulArgs a) {
  const std::size_t N = a.N, C = a.C, OC = a.OC;
  const Tensor inp = r.rand(N * C), w = r.rand(OC * C, 2.0f / std::sqrt(float(C)));
  const Tensor bias = r.rand(OC, 0.5f);
  for (const bool with_bias : {true, false}) {
    const std::string how = with_bias ? " (bias)" : " (no bias)";
    const Tensor out = r.rand(N * OC), pre = r.rand(N * OC);
    r.dev().matmul_gelu_forward(out.p, pre.p, inp.p, w.p, with_bias ? bias.p : nullptr, a, r.s());
    r.out("pre" + how, pre, Check::kAct);
    r.out("out" + how, out, Check::kAct);
  }
}

// dpre = gelu'(pre) * (dout @ w), dweight += gelu(pre)^T dout, dbias += colsum(dout).
void matmul_dgelu_backward(OpRun& r, zo::dev::MatmulArgs a) {
  const std::size_t N = a.N, C = a.C, OC = a.OC;
  const Tensor dout = r.rand(N * OC), pre = r.rand(N * C, 2.0f), inp = r.rand(N * C);
  const Tensor w = r.rand(OC * C, 1.0f / std::sqrt(float(C)));
  const Tensor dpre = r.rand(N * C), dw = r.rand(OC * C), db = r.rand(OC, 0.1f);
  r.dev().matmul_dgelu_backward(dpre.p, dw.p, db.p, dout.p, inp.p, w.p, pre.p, a, r.s());
  r.out("dpre", dpre, Check::kAct);
  r.out("dweight", dw, Check::kAct);
  r.out("dbias", db, Check::kAct);
  const std::vector<std::uint8_t> dbias = r.raw(db);
  const Tensor dpre2 = r.rand(N * C);
  r.dev().matmul_dgelu_backward(dpre2.p, dw.p, nullptr, dout.p, inp.p, w.p, pre.p, a, r.s());
  r.out("dpre (second call)", dpre2, Check::kAct);
  r.out("dweight (second call)", dw, Check::kAct);
  EXPECT_EQ(r.raw(db), dbias) << "a null dbias must leave the bias gradient alone";
}

// ---- elementwise -------------------------------------------------------------------------------

void gelu_forward(OpRun& r, std::size_t n) {
  const Tensor inp = r.rand(n, 2.0f), out = r.rand(n);
  r.dev().gelu_forward(out.p, inp.p, n, r.s());
  r.out("out", out, Check::kAct);
}

void gelu_backward(OpRun& r, std::size_t n) {
  const Tensor inp = r.rand(n, 2.0f), dout = r.rand(n), dinp = r.rand(n);
  r.dev().gelu_backward(dinp.p, inp.p, dout.p, n, r.s());
  r.out("dinp", dinp, Check::kAct);
}

void residual_forward(OpRun& r, std::size_t n) {
  const Tensor a = r.rand(n, 2.0f), b = r.rand(n), out = r.rand(n);
  r.dev().residual_forward(out.p, a.p, b.p, n, r.s());
  r.out("out", out, Check::kAct);
}

void accumulate(OpRun& r, std::size_t n) {
  const Tensor dst = r.rand(n), src = r.rand(n);
  r.dev().accumulate(dst.p, src.p, n, r.s());
  r.out("dst", dst, Check::kAct);
}

// fp32 sums of act-dtype gradients: the sum is exact in fp32 for inputs rounded to the dtype.
void accumulate_f32(OpRun& r, std::size_t n) {
  const Tensor dst = r.f32(r.normal_f32(n)), src = r.rand(n);
  r.dev().accumulate_f32(dst.f(), src.p, n, r.s());
  r.out("dst", dst, Check::kStats);
}

// ---- attention: the backward reads the reference's out and lse
// ------------------------------------

void attention(OpRun& r, zo::dev::AttentionArgs a) {
  const std::size_t BT = std::size_t(a.B) * a.T, C = a.out_width(), C3 = a.qkv_width();
  const std::size_t rows = std::size_t(a.B) * a.NH * a.T;
  const Tensor qkv = r.rand(BT * C3), out = r.rand(BT * C);
  const Tensor lse = r.f32(std::vector<float>(rows, -7.0f));
  r.dev().attention_forward(out.p, lse.f(), qkv.p, a, r.s());
  r.out("out", out, Check::kAct);
  r.out("lse", lse, Check::kStats);
  const Tensor out_in = r.from_reference("out"), lse_in = r.from_reference("lse");
  const Tensor dout = r.rand(BT * C), dqkv = r.rand(BT * C3);
  r.dev().attention_backward(dqkv.p, dout.p, qkv.p, out_in.p, lse_in.f(), a, r.s());
  r.out("dqkv", dqkv, Check::kAct);
}

// Decode attention: the query of position pos against the cache rows [0, pos]; the rows past pos
// hold NaN, which must not be read.
void attention_decode(OpRun& r, zo::dev::AttentionArgs a, int pos) {
  const std::size_t C3 = a.qkv_width(), n_out = std::size_t(a.B) * a.out_width();
  std::vector<float> qkv = r.normal(std::size_t(a.B) * a.T * C3);
  for (std::size_t row = 0; row < std::size_t(a.B) * a.T; ++row) {
    if (int(row % std::size_t(a.T)) <= pos) continue;
    std::fill_n(qkv.begin() + std::ptrdiff_t(row * C3), C3, std::nanf(""));
  }
  const Tensor cache = r.act(qkv), out = r.rand(n_out);
  r.dev().attention_decode(out.p, cache.p, pos, a, r.s());
  r.out("out", out, Check::kAct);
}

// ---- Llama-family ops
// ----------------------------------------------------------------------------

// RMSNorm forward, then the backward from the reference's rstd three ways.
void rmsnorm(OpRun& r, int N, int C, float eps) {
  const std::size_t NC = std::size_t(N) * C;
  const Tensor inp = r.rand(NC, 2.0f, 0.5f), w = r.rand(C, 0.5f, 1.0f), out = r.rand(NC);
  const Tensor rstd = r.f32(std::vector<float>(N, -1.0f));
  r.dev().rmsnorm_forward(out.p, rstd.f(), inp.p, w.p, N, C, eps, r.s());
  r.out("out", out, Check::kAct);
  r.out("rstd", rstd, Check::kStats);
  const Tensor rs = r.from_reference("rstd");
  const Tensor dout = r.rand(NC), dw = r.rand(C);
  norm_backward_three_ways(r, NC,
                           [&](const Tensor& d, const void* dres) {
                             r.dev().rmsnorm_backward(d.p, dres, dw.p, dout.p, inp.p, w.p, rs.f(),
                                                      N, C, r.s());
                           },
                           {{"dweight", dw}});
}

// theta^(-2i/hs) in double, rounded to fp32: model/rope.h's table without scaling.
std::vector<float> rope_inv_freq(int hs, double theta) {
  std::vector<float> f(std::size_t(hs) / 2);
  for (std::size_t i = 0; i < f.size(); ++i)
    f[i] = static_cast<float>(std::pow(theta, -2.0 * double(i) / double(hs)));
  return f;
}

// The rotation of q and k in place, and its transpose on a gradient; v must stay as it was.
void rope(OpRun& r, zo::dev::AttentionArgs a, double theta) {
  const std::size_t BT = std::size_t(a.B) * a.T, ld = a.qkv_width();
  const std::size_t qk = std::size_t(a.NH + a.kv_heads()) * a.head_size();  // q, k columns
  const Tensor inv_freq = r.f32(rope_inv_freq(a.head_size(), theta));
  for (const bool forward : {true, false}) {
    const Tensor x = r.rand(BT * ld);
    const std::vector<float> before = r.get(x);
    if (forward) {
      r.dev().rope_forward(x.p, inv_freq.f(), a, r.s());
    } else {
      r.dev().rope_backward(x.p, inv_freq.f(), a, r.s());
    }
    const std::vector<float> after = r.out(forward ? "qkv" : "dqkv", x, Check::kAct);
    std::size_t changed = 0;
    for (std::size_t i = 0; i < after.size(); ++i)
      changed += i % ld >= qk && std::memcmp(&after[i], &before[i], sizeof(float)) != 0 ? 1 : 0;
    EXPECT_EQ(changed, 0u) << (forward ? "rope_forward" : "rope_backward") << " wrote into v";
  }
}

// rope_forward at a position offset (as a decode step calls it), and the invariant that defines
// the offset: the same bits as rows pos0.. of a sequence rotated from position 0.
void rope_at_offset(OpRun& r, zo::dev::AttentionArgs a, double theta) {
  rope(r, a, theta);
  const std::size_t ld = a.qkv_width(), rows = std::size_t(a.T), lead = std::size_t(a.pos0);
  const Tensor inv_freq = r.f32(rope_inv_freq(a.head_size(), theta));
  const std::vector<float> x = r.normal(rows * ld);
  std::vector<float> full((lead + rows) * ld, 0.0f);
  std::copy(x.begin(), x.end(), full.begin() + std::ptrdiff_t(lead * ld));
  const Tensor at_offset = r.act(x), from_zero = r.act(full);
  zo::dev::AttentionArgs one = a, whole = a;
  one.B = whole.B = 1;
  whole.T = a.pos0 + a.T;
  whole.pos0 = 0;
  r.dev().rope_forward(at_offset.p, inv_freq.f(), one, r.s());
  r.dev().rope_forward(from_zero.p, inv_freq.f(), whole, r.s());
  const std::vector<std::uint8_t> got = r.raw(at_offset), want = r.raw(from_zero);
  const std::size_t esize = want.size() / full.size();
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + std::ptrdiff_t(lead * ld * esize)))
      << "rope_forward at pos0 = " << a.pos0 << " differs from positions " << a.pos0 << ".. of a "
      << "sequence rotated from 0";
}

// out = silu(gate) * up; the gradient into a separate buffer and in place of gate_up: same bits.
void swiglu(OpRun& r, int N, int I) {
  const std::size_t NI = std::size_t(N) * I;
  const std::vector<float> gu = r.normal(2 * NI, 3.0f);
  const Tensor gate_up = r.act(gu), out = r.rand(NI), dout = r.rand(NI), dgu = r.rand(2 * NI);
  r.dev().swiglu_forward(out.p, gate_up.p, N, I, r.s());
  r.out("out", out, Check::kAct);
  r.dev().swiglu_backward(dgu.p, dout.p, gate_up.p, N, I, r.s());
  r.out("dgate_up", dgu, Check::kAct);
  const Tensor in_place = r.act(gu);
  r.dev().swiglu_backward(in_place.p, dout.p, in_place.p, N, I, r.s());
  EXPECT_EQ(r.raw(in_place), r.raw(dgu)) << "swiglu_backward in place of gate_up";
}

// ---- cross-entropy: no dlogits, separate dlogits, dlogits in place of the logits
// -------------------

void cross_entropy(OpRun& r, int N, int V, int ld) {
  const std::size_t NV = std::size_t(N) * ld;
  std::vector<float> logits = padded_rows(r, std::size_t(N), std::size_t(V), std::size_t(ld));
  for (float& v : logits)
    v *= 2.0f;
  logits = round_to(logits, r.t());
  const Tensor x = r.act(logits), targets = r.i32(r.ids(std::size_t(N), V)), dx = r.rand(NV);
  const std::vector<float> dx_before = r.get(dx);
  const float scale = 1.0f / float(N);
  auto losses = [&] { return r.f32(std::vector<float>(std::size_t(N), -1.0f)); };
  const Tensor only = losses(), separate = losses(), aliased = losses();
  r.dev().cross_entropy(only.f(), nullptr, x.p, targets.i(), N, V, ld, scale, r.s());
  r.out("losses (no dlogits)", only, Check::kStats);
  EXPECT_EQ(r.raw(x), encode(logits, x.t)) << "a null dlogits must leave the logits alone";
  r.dev().cross_entropy(separate.f(), dx.p, x.p, targets.i(), N, V, ld, scale, r.s());
  r.out("losses", separate, Check::kStats);
  r.out("dlogits", dx, Check::kAct);
  expect_padding_kept(r, dx, dx_before, std::size_t(V), std::size_t(ld), "dlogits");
  r.dev().cross_entropy(aliased.f(), x.p, x.p, targets.i(), N, V, ld, scale, r.s());
  r.out("losses (aliased)", aliased, Check::kStats);
  r.out("dlogits (aliased)", packed(r, x, std::size_t(V), std::size_t(ld)), Check::kAct);
  expect_padding_kept(r, x, logits, std::size_t(V), std::size_t(ld), "dlogits (aliased)");
}

std::vector<OpCase> make_cases() {
  std::vector<OpCase> cases;
  auto add = [&](std::string name, std::function<void(OpRun&)> run) {
    cases.push_back({std::move(name), std::move(run)});
  };
  // Also run twice on the backend under test, for the same bits.
  auto add_repeatable = [&](std::string name, std::function<void(OpRun&)> run) {
    cases.push_back({std::move(name), std::move(run), true});
  };
  // C 48 and 37 (vector and scalar paths); 4 x 64 rows over 50 tokens (many repeats, several
  // host channel blocks).
  struct Emb {
    int B, T, C, V;
  };
  for (const Emb e : {Emb{2, 13, 48, 101}, Emb{2, 13, 37, 101}, Emb{4, 64, 200, 50}}) {
    const std::string shape = dim("B", e.B) + dim("T", e.T) + dim("C", e.C) + dim("V", e.V);
    add("EmbeddingForward" + shape,
        [e](OpRun& r) { embedding_forward(r, e.B, e.T, e.C, e.V, true); });
    add_repeatable("EmbeddingBackward" + shape,
                   [e](OpRun& r) { embedding_backward(r, e.B, e.T, e.C, e.V, true); });
  }
  for (const Emb e : {Emb{2, 13, 48, 101}, Emb{2, 13, 37, 101}}) {
    const std::string shape = dim("B", e.B) + dim("T", e.T) + dim("C", e.C) + dim("V", e.V);
    add("EmbeddingNoPositionsForward" + shape,
        [e](OpRun& r) { embedding_forward(r, e.B, e.T, e.C, e.V, false); });
    add_repeatable("EmbeddingNoPositionsBackward" + shape,
                   [e](OpRun& r) { embedding_backward(r, e.B, e.T, e.C, e.V, false); });
  }
  struct Rows {
    int N, C;
  };
  // 130 x 520: the weight gradients' 16-byte column blocks (256 bf16 channels) three wide, the
  // last one partial, over three row chunks.
  for (const Rows s : {Rows{26, 48}, Rows{26, 37}, Rows{300, 200}, Rows{130, 520}}) {
    add("LayerNorm" + dim("N", s.N) + dim("C", s.C), [s](OpRun& r) { layernorm(r, s.N, s.C); });
  }
  for (const Rows s : {Rows{26, 48}, Rows{26, 37}}) {
    add("ResidualLayerNorm" + dim("N", s.N) + dim("C", s.C),
        [s](OpRun& r) { residual_layernorm(r, s.N, s.C); });
  }
  // Odd sizes; 1000 rows: the bias gradient in 4 row chunks; 208 x 160 x 288: the largest;
  // 200 x 150: several host row and channel blocks; OC 101 in rows of 128: the LM head's padding.
  using zo::dev::MatmulArgs;
  for (const MatmulArgs a :
       {MatmulArgs{26, 48, 37}, MatmulArgs{1000, 64, 96}, MatmulArgs{208, 160, 288},
        MatmulArgs{200, 80, 150}, MatmulArgs{26, 48, 101, 128}}) {
    std::string shape = dim("N", a.N) + dim("C", a.C) + dim("OC", a.OC);
    if (a.ld_out != 0) shape += dim("ld", a.ld_out);
    add("MatmulForward" + shape, [a](OpRun& r) { matmul_forward(r, a); });
    add_repeatable("MatmulBackward" + shape, [a](OpRun& r) { matmul_backward(r, a); });
  }
  // The GELU epilogues need a multiple of 8 for the GELU matrix's columns (OC forward, C
  // backward): 40 takes them, 37 the fallback kernels.
  for (const MatmulArgs a : {MatmulArgs{26, 48, 40}, MatmulArgs{26, 48, 37}}) {
    add("MatmulGeluForward" + dim("N", a.N) + dim("C", a.C) + dim("OC", a.OC),
        [a](OpRun& r) { matmul_gelu_forward(r, a); });
  }
  for (const MatmulArgs a :
       {MatmulArgs{26, 40, 48}, MatmulArgs{26, 37, 48}, MatmulArgs{26, 40, 45}}) {
    add_repeatable("MatmulDgeluBackward" + dim("N", a.N) + dim("C", a.C) + dim("OC", a.OC),
                   [a](OpRun& r) { matmul_dgelu_backward(r, a); });
  }
  // The bias gradient sums 256-row chunks: N 1 and 37 in one pass, 1000 in 4 chunks, 5000 in
  // 20; OC 1, 96 and 301 against its 32-column blocks.
  for (const int N : {1, 37, 1000, 5000}) {
    for (const int OC : {1, 96, 301}) {
      const MatmulArgs a{N, 5, OC};
      add("MatmulBackward" + dim("N", N) + dim("C", 5) + dim("OC", OC),
          [a](OpRun& r) { matmul_backward(r, a); });
    }
  }
  constexpr std::size_t n = 1251;  // not a multiple of any vector width
  add("GeluForward" + dim("n", n), [](OpRun& r) { gelu_forward(r, n); });
  add("GeluBackward" + dim("n", n), [](OpRun& r) { gelu_backward(r, n); });
  add("ResidualForward" + dim("n", n), [](OpRun& r) { residual_forward(r, n); });
  add("Accumulate" + dim("n", n), [](OpRun& r) { accumulate(r, n); });
  add("AccumulateF32" + dim("n", n), [](OpRun& r) { accumulate_f32(r, n); });
  // Head sizes 16 with odd T, GPT-2's 64 past one 64-row tile, 100 (32-row tiles, two chunks),
  // 10 (not a multiple of 4: the scalar loads); a single token; T 150 (several host query blocks).
  // Heads of 64 and 128 take the tensor-core kernels in bf16 and fp16: 128 with T 1 and 77 (3
  // loop tiles of 32 rows in the backward), 64 with B 2 and T 200 (4 tiles of 64, the last with
  // 8 rows: double buffers refilled). Every case runs twice for the same bits.
  using zo::dev::AttentionArgs;
  for (const AttentionArgs a :
       {AttentionArgs{2, 13, 48, 3}, AttentionArgs{1, 77, 128, 2}, AttentionArgs{1, 40, 200, 2},
        AttentionArgs{2, 9, 30, 3}, AttentionArgs{1, 1, 16, 1}, AttentionArgs{2, 150, 32, 2},
        AttentionArgs{1, 1, 128, 1}, AttentionArgs{1, 77, 256, 2}, AttentionArgs{2, 200, 64, 1}}) {
    add_repeatable("Attention" + dim("B", a.B) + dim("T", a.T) + dim("C", a.C) + dim("NH", a.NH),
                   [a](OpRun& r) { attention(r, a); });
  }
  // Grouped-query attention: 6 query heads over 1, 2, 3 and 6 kv heads, head sizes set apart from
  // C / NH (C = 40 would not divide): 16 and 48 on the FMA kernels, 64 (T 77: two 64-row tiles,
  // the second partial) and 128 (T 70: three 32-row loop tiles) on the tensor-core ones in bf16
  // and fp16.
  for (const AttentionArgs a :
       {AttentionArgs{2, 13, 40, 6, 1, 16}, AttentionArgs{2, 13, 40, 6, 2, 48},
        AttentionArgs{1, 77, 40, 6, 3, 64}, AttentionArgs{1, 70, 40, 6, 2, 128},
        AttentionArgs{1, 9, 40, 6, 6, 64}, AttentionArgs{2, 40, 40, 6, 1, 100}}) {
    add_repeatable("AttentionGqa" + dim("B", a.B) + dim("T", a.T) + dim("NH", a.NH) +
                       dim("NKV", a.NKV) + dim("HS", a.HS),
                   [a](OpRun& r) { attention(r, a); });
  }
  // Decode attention at the first position, one in the middle and the last of the cache, past
  // one 128-key chunk (T 150 and 300); GQA groups of 1, 2, 3 and 6 query heads; head sizes 16, 10
  // (odd lanes), 48, 64, 100 and 128 (more than one pass of the 128 threads over hs).
  for (const auto& [args, position] :
       {std::pair{AttentionArgs{2, 13, 48, 3}, 12}, std::pair{AttentionArgs{1, 9, 30, 3}, 0},
        std::pair{AttentionArgs{2, 150, 40, 6, 2, 48}, 140},
        std::pair{AttentionArgs{1, 300, 40, 6, 3, 64}, 257},
        std::pair{AttentionArgs{2, 40, 40, 6, 1, 100}, 20},
        std::pair{AttentionArgs{1, 7, 40, 2, 2, 10}, 6},
        std::pair{AttentionArgs{1, 33, 40, 6, 6, 128}, 31},
        std::pair{AttentionArgs{1, 1, 40, 6, 6, 16}, 0},
        // Positions split across blocks: 17 splits of 64 keys, the last of 7; and 3 splits of
        // 192 keys (two chunks each) where B x NH = 88 blocks leave fewer SMs to fill.
        std::pair{AttentionArgs{1, 1100, 40, 2, 2, 64}, 1030},
        std::pair{AttentionArgs{2, 400, 40, 44, 11, 16}, 390}}) {
    const AttentionArgs a = args;  // (copies: clang 14 cannot capture structured bindings)
    const int pos = position;
    add_repeatable("AttentionDecode" + dim("B", a.B) + dim("T", a.T) + dim("NH", a.NH) +
                       dim("NKV", a.kv_heads()) + dim("HS", a.head_size()) + dim("pos", pos),
                   [a, pos](OpRun& r) { attention_decode(r, a, pos); });
  }
  for (const Rows s : {Rows{13, 48}, Rows{13, 37}, Rows{300, 200}}) {
    add_repeatable("RmsNorm" + dim("N", s.N) + dim("C", s.C),
                   [s](OpRun& r) { rmsnorm(r, s.N, s.C, 1e-5f); });
  }
  add_repeatable("RmsNorm_N13_C64_eps0p1", [](OpRun& r) { rmsnorm(r, 13, 64, 0.1f); });
  // Head sizes 48, 64 and 128 (and 10: pairs (i, i + 5)), Llama 2's theta 1e4 and Llama 3's 5e5.
  for (const AttentionArgs a :
       {AttentionArgs{2, 13, 40, 6, 2, 48}, AttentionArgs{1, 9, 40, 6, 1, 128},
        AttentionArgs{2, 5, 40, 6, 3, 64}, AttentionArgs{1, 7, 40, 2, 2, 10}}) {
    for (const double theta : {1e4, 5e5}) {
      add("Rope" + dim("B", a.B) + dim("T", a.T) + dim("NH", a.NH) + dim("NKV", a.NKV) +
              dim("HS", a.HS) + dim("theta", static_cast<long>(theta)),
          [a, theta](OpRun& r) { rope(r, a, theta); });
    }
  }
  // At a position offset: one decode row at position 77, three rows from 1000 (large angles).
  for (AttentionArgs a : {AttentionArgs{1, 1, 40, 6, 2, 48}, AttentionArgs{2, 3, 40, 6, 3, 64}}) {
    a.pos0 = a.T == 1 ? 77 : 1000;
    add("Rope" + dim("B", a.B) + dim("T", a.T) + dim("NH", a.NH) + dim("NKV", a.NKV) +
            dim("HS", a.HS) + dim("pos0", a.pos0),
        [a](OpRun& r) { rope_at_offset(r, a, 5e5); });
  }
  for (const Rows s : {Rows{13, 37}, Rows{26, 64}, Rows{1, 1}}) {
    add("SwiGlu" + dim("N", s.N) + dim("I", s.C), [s](OpRun& r) { swiglu(r, s.N, s.C); });
  }
  // GPT-2's vocabulary packed (odd rows: unaligned) and in the CUDA backend's padded rows;
  // 40 x 1999 splits into several host blocks.
  struct Logits {
    int N, V, ld;
  };
  for (const Logits s :
       {Logits{26, 101, 101}, Logits{26, 101, 128}, Logits{5, 256, 256}, Logits{3, 50257, 50257},
        Logits{3, 50257, 50304}, Logits{40, 1999, 1999}}) {
    std::string name = "CrossEntropy" + dim("N", s.N) + dim("V", s.V);
    if (s.ld != s.V) name += dim("ld", s.ld);
    add(name, [s](OpRun& r) { cross_entropy(r, s.N, s.V, s.ld); });
  }
  for (const std::size_t k : {1, 7, 1251, 100003, 200003}) {
    add_repeatable("SumSquares" + dim("n", k), [k](OpRun& r) { step_cases::sum_squares(r, k); });
  }
  add("NonfiniteFlag" + dim("n", 1001), step_cases::nonfinite_flag);
  for (const DType src_t : {DType::kF32, DType::kBF16, DType::kF16}) {
    add("CastFrom_" + std::string(zo::dtype_name(src_t)),
        [src_t](OpRun& r) { step_cases::cast_from(r, src_t); });
    cases.back().any_act_dtype = true;
  }
  add("AdamW" + dim("n", 1001) + "_10steps", [](OpRun& r) { step_cases::adamw(r, {}); });
  // Runs of 7, 293, 1, 698 and 2 elements, decaying, not, decaying, not, decaying.
  constexpr std::uint64_t kDecays = zo::kAdamRunDecays;
  add("AdamWRuns" + dim("n", 1001) + "_10steps", [](OpRun& r) {
    step_cases::adamw(r, {0 | kDecays, 7, 300 | kDecays, 301, 999 | kDecays});
  });
  add("StepGate", step_cases::step_gate);
  add("AdamWGated" + dim("n", 1001), step_cases::adamw_gated);
  return cases;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = make_cases();
  return cases;
}

}  // namespace zo::test
