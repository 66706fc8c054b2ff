// The CUDA backend against the host backend (DESIGN.md §8): every op on random data with odd
// sizes, in fp32 (tight: cuBLASLt runs true fp32, no TF32) and in bf16 / fp16 (inputs rounded to
// the dtype on the host first, so both backends see identical values), backward ops with +=
// onto pre-filled random gradients, then the whole GPT forward and backward. Without a usable GPU
// every test skips with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "device/cuda_device.h"
#include "device/device.h"
#include "gpu/device.h"
#include "gpu/ops.h"
#include "gpu_test_device.h"
#include "model/gpt.h"
#include "model/layout.h"
#include "model/spec.h"
#include "op_compare.h"

namespace {

using zo::DType;
using zo::dev::Buffer;
using zo::dev::Device;
using zo::dev::Stream;

// ---- GPU availability ---------------------------------------------------------------------------

const std::string& no_gpu_reason() {
  static const std::string reason = zo::gpu::no_device_reason();
  return reason;
}

using zo::test::usable_device;

#define ZO_REQUIRE_GPU()                                           \
  do {                                                             \
    if (!no_gpu_reason().empty()) GTEST_SKIP() << no_gpu_reason(); \
  } while (0)

std::unique_ptr<Device> cuda_device(DType t, std::size_t capacity = 0) {
  zo::dev::CudaDeviceOptions o;
  o.device = usable_device();
  o.act_dtype = t;
  o.capacity_bytes = capacity;
  return zo::dev::make_cuda_device(o);
}

using zo::test::act_tol;
using zo::test::contains;
using zo::test::decode;
using zo::test::dtype_param_name;
using zo::test::encode;
using zo::test::expect_close;
using zo::test::kStatsTol;
using zo::test::round_to;
using zo::test::Tol;

// ---- one backend: device, stream and typed transfers
// ------------------------------------------------

struct Tensor {
  Buffer buf;
  void* p = nullptr;  // buf.data() + offset elements
  std::size_t n = 0;
  DType t = DType::kF32;

  float* f() const { return static_cast<float*>(p); }
  std::int32_t* i() const { return static_cast<std::int32_t*>(p); }
};

struct Side {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;
  DType t = DType::kF32;  // activation / parameter storage

  void init(std::unique_ptr<Device> d) {
    dev = std::move(d);
    stream = dev->create_stream();
    t = dev->act_dtype();
  }

  // x stored as dt, `offset` elements into a fresh buffer (offset > 0 gives unaligned operands).
  Tensor put(const std::vector<float>& x, DType dt, std::size_t offset = 0) {
    Tensor r;
    r.t = dt;
    r.n = x.size();
    const std::size_t es = zo::dtype_size(dt);
    r.buf = dev->alloc((x.size() + offset) * es, "test tensor");
    r.p = static_cast<char*>(r.buf.data()) + offset * es;
    const std::vector<std::uint8_t> bytes = encode(x, dt);
    dev->copy_to_device(r.p, bytes.data(), bytes.size(), *stream);
    stream->synchronize();
    return r;
  }
  Tensor act(const std::vector<float>& x, std::size_t offset = 0) { return put(x, t, offset); }
  Tensor f32(const std::vector<float>& x) { return put(x, DType::kF32); }
  Tensor i32(const std::vector<std::int32_t>& x) {
    Tensor r;
    r.t = DType::kF32;  // unused for ints
    r.n = x.size();
    r.buf = dev->alloc(x.size() * 4, "test ints");
    r.p = r.buf.data();
    dev->copy_to_device(r.p, x.data(), x.size() * 4, *stream);
    stream->synchronize();
    return r;
  }
  std::vector<float> get(const Tensor& x) {
    std::vector<std::uint8_t> bytes(x.n * zo::dtype_size(x.t));
    dev->copy_to_host(bytes.data(), x.p, bytes.size(), *stream);
    stream->synchronize();
    return decode(bytes, x.t);
  }
  std::vector<std::uint8_t> raw(const Tensor& x) {
    std::vector<std::uint8_t> bytes(x.n * zo::dtype_size(x.t));
    dev->copy_to_host(bytes.data(), x.p, bytes.size(), *stream);
    stream->synchronize();
    return bytes;
  }
};

// ---- per-op fixture, parameterised by the CUDA activation dtype
// -----------------------------------

class CudaOps : public zo::test::DtypeOpTest {
 protected:
  void SetUp() override {
    ZO_REQUIRE_GPU();
    host_.init(zo::dev::make_host_device({}));
    gpu_.init(cuda_device(GetParam()));
  }

  Side host_, gpu_;
};

// ---- matmul
// ----------------------------------------------------------------------------------------

struct MatmulShape {
  int N, C, OC;
};
// The brief's odd sizes, a shape whose bias gradient is summed in several row chunks, and one
// with offset (unaligned) operands.
constexpr MatmulShape kMatmulShapes[] = {{26, 48, 37}, {1000, 64, 96}, {208, 160, 288}};

TEST_P(CudaOps, MatmulForwardWithAndWithoutBias) {
  for (const MatmulShape& sh : kMatmulShapes) {
    for (bool with_bias : {true, false}) {
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        SCOPED_TRACE("N=" + std::to_string(sh.N) + " C=" + std::to_string(sh.C) +
                     " OC=" + std::to_string(sh.OC) + (with_bias ? " bias" : " no bias") +
                     " offset " + std::to_string(offset));
        const std::size_t N = sh.N, C = sh.C, OC = sh.OC;
        const auto inp = rand(N * C);
        const auto w = rand(OC * C, 1.0f / std::sqrt(float(C)));
        const auto bias = rand(OC, 0.5f);
        const auto junk = rand(N * OC);  // "written" means every element, whatever was there
        auto run = [&](Side& d) {
          Tensor out = d.act(junk, offset), x = d.act(inp, offset), wt = d.act(w, offset);
          Tensor b = d.act(bias, offset);
          d.dev->matmul_forward(out.p, x.p, wt.p, with_bias ? b.p : nullptr, {sh.N, sh.C, sh.OC},
                                *d.stream);
          return d.get(out);
        };
        expect_close(run(gpu_), run(host_), tol(), "matmul out");
      }
    }
  }
}

TEST_P(CudaOps, MatmulBackwardAccumulatesAndIsDeterministic) {
  for (const MatmulShape& sh : kMatmulShapes) {
    for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      SCOPED_TRACE("N=" + std::to_string(sh.N) + " C=" + std::to_string(sh.C) +
                   " OC=" + std::to_string(sh.OC) + " offset " + std::to_string(offset));
      const std::size_t N = sh.N, C = sh.C, OC = sh.OC;
      const auto dout = rand(N * OC);
      const auto inp = rand(N * C);
      const auto w = rand(OC * C, 1.0f / std::sqrt(float(C)));
      const auto dinp0 = rand(N * C), dw0 = rand(OC * C), db0 = rand(OC);
      struct Grads {
        std::vector<float> dinp, dw, db, db_after_null;
      };
      auto run = [&](Side& d) {
        Tensor dy = d.act(dout, offset), x = d.act(inp, offset), wt = d.act(w, offset);
        Tensor dx = d.act(dinp0, offset), dwt = d.act(dw0, offset), db = d.act(db0, offset);
        d.dev->matmul_backward(dx.p, dwt.p, db.p, dy.p, x.p, wt.p, {sh.N, sh.C, sh.OC}, *d.stream);
        Grads g{d.get(dx), d.get(dwt), d.get(db), {}};
        // A second call without dbias adds to dinp/dweight only.
        d.dev->matmul_backward(dx.p, dwt.p, nullptr, dy.p, x.p, wt.p, {sh.N, sh.C, sh.OC},
                               *d.stream);
        g.db_after_null = d.get(db);
        return g;
      };
      const Grads got = run(gpu_), want = run(host_);
      expect_close(got.dinp, want.dinp, tol(), "dinp");
      expect_close(got.dw, want.dw, tol(), "dweight");
      expect_close(got.db, want.db, tol(), "dbias");
      EXPECT_EQ(got.db_after_null, got.db) << "a null dbias must leave the bias gradient alone";
      const Grads again = run(gpu_);
      EXPECT_EQ(again.dinp, got.dinp);
      EXPECT_EQ(again.dw, got.dw);
      EXPECT_EQ(again.db, got.db);
    }
  }
}

// ---- embedding
// --------------------------------------------------------------------------------------

TEST_P(CudaOps, EmbeddingForwardAndBackward) {
  const int B = 2, T = 13, C = 48, V = 101;
  const std::size_t BT = std::size_t(B) * T;
  auto tok = tokens(BT, V);
  tok[7] = tok[0];  // repeated tokens accumulate into one wte row
  tok[20] = tok[0];
  const auto wte = rand(std::size_t(V) * C), wpe = rand(std::size_t(T) * C);
  const auto junk = rand(BT * C), dout = rand(BT * C);
  const auto dwte0 = rand(std::size_t(V) * C), dwpe0 = rand(std::size_t(T) * C);
  struct Out {
    std::vector<float> out, dwte, dwpe;
  };
  auto run = [&](Side& d) {
    Tensor tk = d.i32(tok), e = d.act(wte), p = d.act(wpe), out = d.act(junk);
    Tensor dy = d.act(dout), de = d.act(dwte0), dp = d.act(dwpe0);
    d.dev->embedding_forward(out.p, tk.i(), e.p, p.p, B, T, C, *d.stream);
    d.dev->embedding_backward(de.p, dp.p, dy.p, tk.i(), B, T, C, *d.stream);
    return Out{d.get(out), d.get(de), d.get(dp)};
  };
  const Out got = run(gpu_), want = run(host_);
  expect_close(got.out, want.out, tol(), "embedding out");
  expect_close(got.dwte, want.dwte, tol(), "dwte");
  expect_close(got.dwpe, want.dwpe, tol(), "dwpe");
  EXPECT_EQ(run(gpu_).dwte, got.dwte) << "embedding backward must be deterministic";
}

// ---- layernorm
// ----------------------------------------------------------------------------------------

TEST_P(CudaOps, LayerNormForwardAndBackward) {
  const int N = 26, C = 48;
  const std::size_t NC = std::size_t(N) * C;
  const auto inp = rand(NC, 2.0f, 0.5f), weight = rand(C, 0.5f, 1.0f), bias = rand(C, 0.5f);
  const auto junk = rand(NC), dout = rand(NC);
  const auto dinp0 = rand(NC), dw0 = rand(C), db0 = rand(C);
  // The backward inputs (mean, rstd) come from the host forward, so both sides see the same.
  std::vector<float> mean_h, rstd_h;
  struct Out {
    std::vector<float> out, mean, rstd, dinp, dw, db;
  };
  auto run = [&](Side& d, bool fill_stats) {
    Tensor x = d.act(inp), w = d.act(weight), b = d.act(bias), out = d.act(junk);
    Tensor mean = d.f32(std::vector<float>(N, -1.0f)), rstd = d.f32(std::vector<float>(N, -1.0f));
    d.dev->layernorm_forward(out.p, mean.f(), rstd.f(), x.p, w.p, b.p, N, C, *d.stream);
    Out o{d.get(out), d.get(mean), d.get(rstd), {}, {}, {}};
    if (fill_stats) {
      mean_h = o.mean;
      rstd_h = o.rstd;
    }
    Tensor m = d.f32(mean_h), r = d.f32(rstd_h), dy = d.act(dout);
    Tensor dx = d.act(dinp0), dw = d.act(dw0), db = d.act(db0);
    d.dev->layernorm_backward(dx.p, dw.p, db.p, dy.p, x.p, w.p, m.f(), r.f(), N, C, *d.stream);
    o.dinp = d.get(dx), o.dw = d.get(dw), o.db = d.get(db);
    return o;
  };
  const Out want = run(host_, true), got = run(gpu_, false);
  expect_close(got.out, want.out, tol(), "layernorm out");
  expect_close(got.mean, want.mean, kStatsTol, "mean");
  expect_close(got.rstd, want.rstd, kStatsTol, "rstd");
  expect_close(got.dinp, want.dinp, tol(), "layernorm dinp");
  expect_close(got.dw, want.dw, tol(), "layernorm dweight");
  expect_close(got.db, want.db, tol(), "layernorm dbias");
}

// ---- elementwise
// --------------------------------------------------------------------------------------

TEST_P(CudaOps, GeluResidualAccumulate) {
  const std::size_t n = 2 * 13 * 48 + 3;  // not a multiple of any vector width
  const auto x = rand(n, 2.0f), y = rand(n), dout = rand(n), dinp0 = rand(n), junk = rand(n);
  struct Out {
    std::vector<float> gelu, dgelu, residual, acc;
  };
  auto run = [&](Side& d) {
    Tensor a = d.act(x), b = d.act(y), dy = d.act(dout), out = d.act(junk), dx = d.act(dinp0);
    Out o;
    d.dev->gelu_forward(out.p, a.p, n, *d.stream);
    o.gelu = d.get(out);
    d.dev->gelu_backward(dx.p, a.p, dy.p, n, *d.stream);
    o.dgelu = d.get(dx);
    d.dev->residual_forward(out.p, a.p, b.p, n, *d.stream);
    o.residual = d.get(out);
    d.dev->accumulate(b.p, dy.p, n, *d.stream);
    o.acc = d.get(b);
    return o;
  };
  const Out got = run(gpu_), want = run(host_);
  expect_close(got.gelu, want.gelu, tol(), "gelu");
  expect_close(got.dgelu, want.dgelu, tol(), "gelu dinp");
  expect_close(got.residual, want.residual, tol(), "residual");
  expect_close(got.acc, want.acc, tol(), "accumulate");
}

// ---- attention
// ----------------------------------------------------------------------------------------

TEST_P(CudaOps, AttentionForwardAndBackward) {
  struct Shape {
    int B, T, C, NH;
  };
  // hs 16 with odd T; the GPT-2 head size 64 with T past one 64-row tile.
  for (const Shape sh : {Shape{2, 13, 48, 3}, Shape{1, 77, 128, 2}}) {
    SCOPED_TRACE("B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) +
                 " C=" + std::to_string(sh.C) + " NH=" + std::to_string(sh.NH));
    const std::size_t BT = std::size_t(sh.B) * sh.T, C = sh.C;
    const std::size_t rows = std::size_t(sh.B) * sh.NH * sh.T;
    const auto qkv = rand(BT * 3 * C), junk = rand(BT * C), dout = rand(BT * C);
    const auto dqkv0 = rand(BT * 3 * C);
    const zo::dev::AttentionArgs args{sh.B, sh.T, sh.C, sh.NH};
    std::vector<float> out_h, lse_h;
    struct Out {
      std::vector<float> out, lse, dqkv;
    };
    auto run = [&](Side& d, bool keep) {
      Tensor x = d.act(qkv), out = d.act(junk), lse = d.f32(std::vector<float>(rows, -7.0f));
      d.dev->attention_forward(out.p, lse.f(), x.p, args, *d.stream);
      Out o{d.get(out), d.get(lse), {}};
      // The backward reads the host forward's out (in the dtype under test) and lse on both sides.
      if (keep) {
        out_h = round_to(o.out, t());
        lse_h = o.lse;
      }
      Tensor o_in = d.act(out_h), l_in = d.f32(lse_h), dy = d.act(dout), dx = d.act(dqkv0);
      d.dev->attention_backward(dx.p, dy.p, x.p, o_in.p, l_in.f(), args, *d.stream);
      o.dqkv = d.get(dx);
      return o;
    };
    const Out want = run(host_, true), got = run(gpu_, false);
    expect_close(got.out, want.out, tol(), "attention out");
    expect_close(got.lse, want.lse, kStatsTol, "lse");
    expect_close(got.dqkv, want.dqkv, tol(), "dqkv");
  }
}

// ---- cross-entropy
// ------------------------------------------------------------------------------------

TEST_P(CudaOps, CrossEntropyWithSeparateAliasedAndNoGradient) {
  struct Shape {
    int N, V;
  };
  for (const Shape sh : {Shape{26, 101}, Shape{3, 50257}}) {
    SCOPED_TRACE("N=" + std::to_string(sh.N) + " V=" + std::to_string(sh.V));
    const std::size_t NV = std::size_t(sh.N) * sh.V;
    const auto logits = rand(NV, 2.0f), junk = rand(NV);
    const auto targets = tokens(std::size_t(sh.N), sh.V);
    const float scale = 1.0f / float(sh.N);
    struct Out {
      std::vector<float> losses_only, losses, dlogits, losses_aliased, dlogits_aliased, untouched;
    };
    auto run = [&](Side& d) {
      Tensor x = d.act(logits), tg = d.i32(targets), dx = d.act(junk);
      Tensor losses = d.f32(std::vector<float>(std::size_t(sh.N), -1.0f));
      Out o;
      d.dev->cross_entropy(losses.f(), nullptr, x.p, tg.i(), sh.N, sh.V, scale, *d.stream);
      o.losses_only = d.get(losses);
      o.untouched = d.get(x);
      d.dev->cross_entropy(losses.f(), dx.p, x.p, tg.i(), sh.N, sh.V, scale, *d.stream);
      o.losses = d.get(losses);
      o.dlogits = d.get(dx);
      d.dev->cross_entropy(losses.f(), x.p, x.p, tg.i(), sh.N, sh.V, scale, *d.stream);
      o.losses_aliased = d.get(losses);
      o.dlogits_aliased = d.get(x);
      return o;
    };
    const Out got = run(gpu_), want = run(host_);
    expect_close(got.losses_only, want.losses_only, kStatsTol, "losses (no dlogits)");
    EXPECT_EQ(got.untouched, logits) << "a null dlogits must leave the logits alone";
    expect_close(got.losses, want.losses, kStatsTol, "losses");
    expect_close(got.dlogits, want.dlogits, tol(), "dlogits");
    expect_close(got.losses_aliased, want.losses_aliased, kStatsTol, "losses (aliased)");
    expect_close(got.dlogits_aliased, want.dlogits_aliased, tol(), "dlogits (aliased)");
  }
}

// ---- reductions
// -----------------------------------------------------------------------------------------

TEST_P(CudaOps, SumSquaresAccumulatesDeterministically) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1251}, std::size_t{100003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = rand(n);
    auto run = [&](Side& d) {
      Tensor data = d.act(x), out = d.f32({1.5f});
      d.dev->sum_squares(out.f(), data.p, n, *d.stream);
      return d.get(out);
    };
    const std::vector<float> got = run(gpu_), want = run(host_);
    EXPECT_NEAR(got[0], want[0], 1e-5 * std::fabs(want[0])) << "sum of squares + 1.5";
    EXPECT_EQ(run(gpu_), got) << "sum_squares must be bit-reproducible";
  }
}

TEST_P(CudaOps, NonfiniteFlag) {
  const std::size_t n = 1001;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto flag_after = [&](const std::vector<float>& x, float preset) {
    Tensor data = gpu_.act(x), flag = gpu_.f32({preset});
    gpu_.dev->nonfinite_flag(flag.f(), data.p, x.size(), *gpu_.stream);
    return gpu_.get(flag)[0];
  };
  const auto finite = rand(n, 100.0f);
  EXPECT_EQ(flag_after(finite, 0.0f), 0.0f);
  EXPECT_EQ(flag_after(finite, 0.25f), 0.25f) << "a finite tensor leaves the flag as it was";
  const std::pair<std::size_t, float> bad[] = {{0, -inf}, {777, inf}, {n - 1, nan}, {500, nan}};
  for (const auto& [index, value] : bad) {
    std::vector<float> x = finite;
    x[index] = value;
    EXPECT_EQ(flag_after(x, 0.0f), 1.0f) << value << " at " << index;
  }
}

// ---- cast
// ---------------------------------------------------------------------------------------------

TEST_P(CudaOps, CastMatchesHostConvertersBitForBit) {
  const std::vector<float> x = cast_inputs();
  const std::size_t n = x.size();
  Tensor src = gpu_.f32(x);
  Tensor narrow = gpu_.put(std::vector<float>(n, 0.0f), t());
  gpu_.dev->cast(narrow.p, t(), src.p, DType::kF32, n, *gpu_.stream);
  EXPECT_EQ(gpu_.raw(narrow), encode(x, t())) << "fp32 -> " << zo::dtype_name(t());
  Tensor wide = gpu_.f32(std::vector<float>(n, 0.0f));
  gpu_.dev->cast(wide.p, DType::kF32, narrow.p, t(), n, *gpu_.stream);
  EXPECT_EQ(gpu_.raw(wide), encode(round_to(x, t()), DType::kF32))
      << zo::dtype_name(t()) << " -> fp32";
}

// ---- AdamW
// ------------------------------------------------------------------------------------------

TEST_P(CudaOps, AdamWMatchesHostOverTenSteps) {
  const std::size_t n = 1001;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> master0(n);
  for (float& v : master0)
    v = normal(rng_);
  const std::vector<float> zeros(n, 0.0f);
  Tensor gm = gpu_.f32(master0), gmo = gpu_.f32(zeros), gv = gpu_.f32(zeros);
  Tensor gp = gpu_.act(zeros);
  Tensor hm = host_.f32(master0), hmo = host_.f32(zeros), hv = host_.f32(zeros);
  zo::AdamConfig c;
  c.lr = 1e-2f;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.eps = 1e-8f;
  c.weight_decay = 0.1f;
  const float grad_mult = 0.5f;
  for (std::int64_t k = 1; k <= 10; ++k) {
    const auto g = rand(n);  // representable in the dtype under test
    Tensor gg = gpu_.act(g), hg = host_.f32(g);
    gpu_.dev->adamw(gm.f(), gmo.f(), gv.f(), gg.p, gp.p, n, c, k, grad_mult, *gpu_.stream);
    host_.dev->adamw(hm.f(), hmo.f(), hv.f(), hg.p, nullptr, n, c, k, grad_mult, *host_.stream);
    // Both streams run asynchronously: the gradients must outlive the steps that read them.
    gpu_.stream->synchronize();
    host_.stream->synchronize();
  }
  const std::vector<float> master = gpu_.get(gm);
  expect_close(master, host_.get(hm), kStatsTol, "master");
  expect_close(gpu_.get(gmo), host_.get(hmo), kStatsTol, "m");
  expect_close(gpu_.get(gv), host_.get(hv), kStatsTol, "v");
  EXPECT_EQ(gpu_.raw(gp), encode(master, t())) << "params_out is the new master, rounded";
}

// ---- the whole model
// -----------------------------------------------------------------------------------

TEST_P(CudaOps, GptLossAndGradientsMatchHost) {
  const zo::model::ModelSpec spec = zo::model::model_spec_from_json(
      {{"n_layer", 2}, {"n_head", 3}, {"n_embd", 48}, {"vocab_size", 101}, {"block_size", 16}},
      "tiny-cuda");
  const zo::model::ParameterLayout layout(spec);
  const int B = 2, T = 13;
  const std::size_t BT = std::size_t(B) * T;
  std::vector<float> params(layout.size());
  zo::model::init_gpt2(layout, 7, params.data());
  // Larger weights and random LayerNorm affine / biases so that every gradient is non-trivial.
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (const auto& ti : layout.tensors()) {
    for (std::size_t i = 0; i < ti.numel; ++i) {
      float& p = params[ti.offset + i];
      if (ti.kind == zo::model::TensorKind::kMatrix ||
          ti.kind == zo::model::TensorKind::kEmbedding) {
        p *= 3.0f;
      } else {
        p += normal(rng_);
      }
    }
  }
  params = round_to(params, t());
  const auto tok = tokens(BT, spec.vocab_size), tgt = tokens(BT, spec.vocab_size);
  struct Out {
    std::vector<float> losses, grads;
  };
  auto run = [&](Side& d) {
    Tensor p = d.act(params), g = d.act(std::vector<float>(layout.size(), 0.0f));
    zo::model::Gpt gpt(*d.dev, layout, {B, T, false});
    gpt.set_batch(tok, tgt, *d.stream);
    // dloss_scale 1 (the gradient of the summed loss) keeps fp16 gradients out of subnormals.
    gpt.forward(p.p, T, true, 1.0f, *d.stream);
    gpt.backward(p.p, g.p, *d.stream);
    Tensor losses;
    losses.p = const_cast<float*>(gpt.losses());
    losses.n = BT;
    losses.t = DType::kF32;
    Out o{d.get(losses), d.get(g)};
    return o;
  };
  const Out got = run(gpu_), want = run(host_);
  const bool f32 = t() == DType::kF32;
  const double mean_got = std::accumulate(got.losses.begin(), got.losses.end(), 0.0) / double(BT);
  const double mean_want =
      std::accumulate(want.losses.begin(), want.losses.end(), 0.0) / double(BT);
  EXPECT_NEAR(mean_got, mean_want, (f32 ? 1e-5 : 2e-2) * mean_want) << "mean loss";
  expect_close(got.losses, want.losses, f32 ? Tol{1e-5, 1e-4} : Tol{2e-2, 1e-1}, "losses");
  // Per tensor, by norm: 16-bit activations compound over the layers.
  for (const auto& ti : layout.tensors()) {
    SCOPED_TRACE(ti.name);
    double diff2 = 0.0, want2 = 0.0;
    for (std::size_t i = ti.offset; i < ti.offset + ti.numel; ++i) {
      const double d = double(got.grads[i]) - double(want.grads[i]);
      diff2 += d * d;
      want2 += double(want.grads[i]) * double(want.grads[i]);
    }
    ASSERT_GT(want2, 0.0) << "zero reference gradient";
    EXPECT_LE(std::sqrt(diff2 / want2), f32 ? 1e-4 : 5e-2) << "relative gradient error norm";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         dtype_param_name);

// ---- the device itself
// ----------------------------------------------------------------------------

TEST(CudaDevice, FactoryExplainsAMissingGpu) {
  if (no_gpu_reason().empty()) GTEST_SKIP() << "a usable GPU is present";
  try {
    (void)zo::dev::make_cuda_device({});
    FAIL() << "make_cuda_device returned without a usable GPU";
  } catch (const std::exception& e) {
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

TEST(CudaDevice, FactoryRejectsBadOptions) {
  ZO_REQUIRE_GPU();
  zo::dev::CudaDeviceOptions o;
  o.device = int(zo::gpu::query_devices().size()) + 3;
  EXPECT_THROW((void)zo::dev::make_cuda_device(o), std::out_of_range);
  o.device = usable_device();
  o.act_dtype = static_cast<DType>(9);
  EXPECT_THROW((void)zo::dev::make_cuda_device(o), std::invalid_argument);
}

TEST(CudaDevice, NameBackendAndDtype) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  EXPECT_EQ(dev->backend(), zo::dev::Backend::kCuda);
  EXPECT_EQ(dev->act_dtype(), DType::kBF16);
  const std::string name = dev->name();
  EXPECT_EQ(name.rfind("cuda:" + std::to_string(usable_device()) + " ", 0), 0u) << name;
  EXPECT_TRUE(contains(name, "(bf16)")) << name;
  EXPECT_TRUE(contains(cuda_device(DType::kF16)->name(), "(fp16)"));
}

// ZO_SYNC_EACH_OP=1 (read when the device is made): an op's call returns only once the op has
// run, so the call lasts at least as long as the GPU takes for it (measured with events first).
TEST(CudaDevice, SyncEachOpWaitsForEveryOp) {
  ZO_REQUIRE_GPU();
  // A 4096^3 fp32 GEMM (256^3 on the SIMT emulator): milliseconds, against microseconds to
  // enqueue it.
  const int n = contains(cuda_device(DType::kF32)->name(), "SIMT emulator") ? 256 : 4096;
  auto gemm_ms = [n](zo::dev::Device& dev, bool host_clock) {
    const auto s = dev.create_stream();
    const auto t0 = dev.create_event(), t1 = dev.create_event();
    Buffer a = dev.alloc(std::size_t(n) * n * 4, "a"), out = dev.alloc(std::size_t(n) * n * 4, "o");
    dev.fill_zero(a.data(), a.bytes(), *s);
    double best = 1e30;
    for (int k = 0; k < 3; ++k) {
      s->synchronize();
      dev.record(*t0, *s);
      const auto h0 = std::chrono::steady_clock::now();
      dev.matmul_forward(out.data(), a.data(), a.data(), nullptr, {n, n, n}, *s);
      const double host_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
      dev.record(*t1, *s);
      t1->synchronize();
      best = std::min(best, host_clock ? host_ms : t1->elapsed_ms_since(*t0));
    }
    return best;
  };
  const double gpu_ms = gemm_ms(*cuda_device(DType::kF32), false);
  ::setenv("ZO_SYNC_EACH_OP", "1", 1);
  const auto synced = cuda_device(DType::kF32);
  ::unsetenv("ZO_SYNC_EACH_OP");
  const double call_ms = gemm_ms(*synced, true);
  EXPECT_GE(call_ms, 0.5 * gpu_ms) << "the call returned before the GEMM had run";
}

TEST(CudaDevice, CapacityCachingAndOutOfMemory) {
  ZO_REQUIRE_GPU();
  constexpr std::size_t kCap = std::size_t{64} << 20;
  const auto dev = cuda_device(DType::kBF16, kCap);
  EXPECT_EQ(dev->capacity_bytes(), kCap);
  EXPECT_EQ(dev->used_bytes(), 0u);
  void* first = nullptr;
  {
    Buffer a = dev->alloc(1000, "a");
    first = a.data();
    EXPECT_NE(first, nullptr);
    EXPECT_GE(dev->used_bytes(), 1000u);
    EXPECT_LE(dev->used_bytes(), 1024u);
    Buffer z = dev->alloc(0, "zero bytes");
    EXPECT_NE(z.data(), nullptr);
    EXPECT_NE(z.data(), a.data());
  }
  EXPECT_EQ(dev->used_bytes(), 0u);
  {
    Buffer again = dev->alloc(1000, "again");
    EXPECT_EQ(again.data(), first) << "a freed block of the same size class is reused";
  }
  Buffer big = dev->alloc(40u << 20, "big");
  try {
    (void)dev->alloc(30u << 20, "too much");
    FAIL() << "allocating past the capacity must throw";
  } catch (const zo::OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 30u << 20);
    EXPECT_EQ(e.capacity(), kCap);
    EXPECT_EQ(e.in_use(), dev->used_bytes());
    EXPECT_TRUE(contains(e.what(), "too much")) << e.what();
  }
  big.reset();
  Buffer fits = dev->alloc(60u << 20, "fits after release");  // flushes the cached 40 MiB block
  EXPECT_NE(fits.data(), nullptr);
}

TEST(CudaDevice, CopiesFillAndOverlappingMove) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto s = dev->create_stream();
  std::vector<std::uint8_t> pattern(4099);
  std::iota(pattern.begin(), pattern.end(), std::uint8_t{1});
  Buffer a = dev->alloc(pattern.size(), "a"), b = dev->alloc(pattern.size(), "b");
  dev->copy_to_device(a.data(), pattern.data(), pattern.size(), *s);  // pageable host memory
  dev->copy_on_device(b.data(), a.data(), pattern.size(), *s);
  std::vector<std::uint8_t> expect = pattern;
  auto* bp = b.as<std::uint8_t>();
  dev->copy_on_device(bp + 3, bp, 4000, *s);  // overlapping, forward
  std::memmove(expect.data() + 3, expect.data(), 4000);
  dev->copy_on_device(bp + 10, bp + 50, 3000, *s);  // overlapping, backward
  std::memmove(expect.data() + 10, expect.data() + 50, 3000);
  dev->fill_zero(bp + 100, 77, *s);
  std::fill_n(expect.begin() + 100, 77, std::uint8_t{0});
  std::vector<std::uint8_t> got(pattern.size());
  dev->copy_to_host(got.data(), b.data(), got.size(), *s);
  s->synchronize();
  EXPECT_EQ(got, expect);
  std::vector<std::uint8_t> back(pattern.size());
  dev->copy_to_host(back.data(), a.data(), back.size(), *s);
  s->synchronize();
  EXPECT_EQ(back, pattern);
}

TEST(CudaDevice, EventsOrderStreamsAndTime) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto s1 = dev->create_stream(), s2 = dev->create_stream();
  const auto start = dev->create_event(), done = dev->create_event(), never = dev->create_event();
  EXPECT_TRUE(never->query());
  never->synchronize();
  EXPECT_THROW((void)done->elapsed_ms_since(*never), std::logic_error);

  constexpr std::size_t kBytes = std::size_t{64} << 20;
  Buffer a = dev->alloc(kBytes, "a"), b = dev->alloc(kBytes, "b");
  std::vector<std::uint8_t> host(kBytes, 0x5a);
  dev->record(*start, *s1);
  dev->copy_to_device(a.data(), host.data(), kBytes, *s1);
  dev->record(*done, *s1);
  dev->wait(*s2, *done);  // s2's copy must see s1's upload
  dev->copy_on_device(b.data(), a.data(), kBytes, *s2);
  std::vector<std::uint8_t> back(kBytes, 0);
  dev->copy_to_host(back.data(), b.data(), kBytes, *s2);
  s2->synchronize();
  EXPECT_TRUE(done->query());
  EXPECT_EQ(back, host);
  done->synchronize();
  const double ms = done->elapsed_ms_since(*start);
  EXPECT_GE(ms, 0.0);
  EXPECT_LT(ms, 60e3);
}

TEST(CudaDevice, RejectsForeignStreamsAndEvents) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto host = zo::dev::make_host_device({});
  const auto hs = host->create_stream();
  const auto he = host->create_event();
  const auto cs = dev->create_stream();
  Buffer x = dev->alloc(64, "x");
  EXPECT_THROW(dev->fill_zero(x.data(), 64, *hs), std::invalid_argument);
  EXPECT_THROW(dev->record(*he, *cs), std::invalid_argument);
  EXPECT_THROW(dev->gelu_forward(x.data(), x.data(), 8, *hs), std::invalid_argument);
}

// Two streams sharing the matmul workspace must not race: alternate GEMMs on both and compare.
TEST(CudaDevice, MatmulOnTwoStreamsMatchesOneStream) {
  ZO_REQUIRE_GPU();
  const auto dev = cuda_device(DType::kBF16);
  const auto s1 = dev->create_stream(), s2 = dev->create_stream();
  const int N = 512, C = 256, OC = 768;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto upload = [&](std::size_t n) {
    std::vector<float> x(n);
    for (float& v : x)
      v = normal(rng);
    const auto bytes = encode(x, DType::kBF16);
    Buffer b = dev->alloc(bytes.size(), "x");
    dev->copy_to_device(b.data(), bytes.data(), bytes.size(), *s1);
    s1->synchronize();
    return b;
  };
  Buffer inp = upload(std::size_t(N) * C), w = upload(std::size_t(OC) * C), bias = upload(OC);
  std::vector<Buffer> outs;
  for (int k = 0; k < 8; ++k) {
    outs.push_back(dev->alloc(std::size_t(N) * OC * 2, "out"));
    dev->matmul_forward(outs.back().data(), inp.data(), w.data(), bias.data(), {N, C, OC},
                        k % 2 == 0 ? *s1 : *s2);
  }
  s1->synchronize();
  s2->synchronize();
  std::vector<std::uint8_t> first(std::size_t(N) * OC * 2), other(first.size());
  dev->copy_to_host(first.data(), outs[0].data(), first.size(), *s1);
  s1->synchronize();
  for (std::size_t k = 1; k < outs.size(); ++k) {
    dev->copy_to_host(other.data(), outs[k].data(), other.size(), *s1);
    s1->synchronize();
    EXPECT_EQ(other, first) << "output " << k;
  }
}

// The launcher level: plans are created once per (shape, dtype, op, alignment).
TEST(CudaMatmul, PlansAreCachedPerShapeAndAlignment) {
  ZO_REQUIRE_GPU();
  zo::gpu::require_device(usable_device());
  struct Destroy {
    void operator()(zo::gpu::MatmulContext* c) const noexcept {
      zo::gpu::destroy_matmul_context(c);
    }
  };
  const std::unique_ptr<zo::gpu::MatmulContext, Destroy> owner(zo::gpu::create_matmul_context());
  zo::gpu::MatmulContext* ctx = owner.get();
  // OC * 4 bytes is a multiple of 32, so the output's alignment is set by its address alone.
  const int N = 26, C = 48, OC = 40;
  zo::test::GpuBuffer out(std::size_t(N) * OC * 4 + 16), inp(std::size_t(N) * C * 4 + 16),
      w(std::size_t(OC) * C * 4 + 16);
  std::vector<float> ones(std::size_t(OC) * C + 4, 0.5f);
  inp.copy_from_host(ones.data(), std::size_t(N) * C * 4);
  w.copy_from_host(ones.data(), std::size_t(OC) * C * 4);
  for (int k = 0; k < 3; ++k) {
    zo::gpu::launch_matmul_forward(ctx, out.data(), inp.data(), w.data(), nullptr, N, C, OC,
                                   DType::kF32, nullptr);
  }
  EXPECT_EQ(zo::gpu::matmul_plan_count(ctx), 1u);
  zo::gpu::launch_matmul_forward(ctx, out.as<float>() + 1, inp.data(), w.data(), nullptr, N, C, OC,
                                 DType::kF32, nullptr);
  EXPECT_EQ(zo::gpu::matmul_plan_count(ctx), 2u) << "a 4-byte aligned output needs its own plan";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> host(std::size_t(N) * OC);
  out.copy_to_host(host.data(), host.size() * 4);
  EXPECT_FLOAT_EQ(host[0], 48 * 0.25f);
  EXPECT_THROW(zo::gpu::launch_matmul_forward(ctx, out.data(), inp.data(), w.data(), nullptr, 0, C,
                                              OC, DType::kF32, nullptr),
               std::invalid_argument);
}

}  // namespace
