// Host backend of zo::dev::Device. This file is the numerical reference for the CUDA backend:
// every op forward against an independent float64 scalar reference, every backward against the
// float64 analytic gradient and against central finite differences (float64) of a random scalar
// objective L = sum(w * out), on random data of odd sizes; plus streams, events, task errors,
// argument checks, capacity; and the op-case table (op_cases.h) on three threads against one,
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"
#include "device/event_clock.h"
#include "device/host_stream.h"
#include "op_cases.h"
#include "ref_16bit.h"

namespace {

using zo::DType;
using zo::OutOfMemoryError;
using zo::dev::AttentionArgs;
using zo::dev::Buffer;
using zo::dev::Device;
using zo::dev::Event;
using zo::dev::HostDeviceOptions;
using zo::dev::HostStream;
using zo::dev::MatmulArgs;
using zo::dev::Stream;
using Vec = std::vector<double>;

// ---- data and comparisons ------------------------------------------------------------------

std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v)
    x = dist(rng);
  return v;
}

std::vector<std::int32_t> random_ids(std::size_t n, int limit, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, limit - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v)
    x = dist(rng);
  return v;
}

Vec to_double(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

Vec minus(const std::vector<float>& a, const std::vector<float>& b) {
  Vec d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    d[i] = double{a[i]} - double{b[i]};
  return d;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

// Passes when |got - want| <= rtol * (|want| + max|want|) everywhere: relative for large values,
// normwise for values that come out of cancellation.
void expect_close(const Vec& got, const Vec& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (double w : want)
    scale = std::max(scale, std::fabs(w));
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double ratio = err / (rtol * (std::fabs(want[i]) + scale) + 1e-300);
    if (!(ratio <= 1.0)) ++bad;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements out of tolerance; worst at " << worst << ": got " << got[worst]
                     << ", want " << want[worst] << " (error " << worst_ratio
                     << "x the tolerance, rtol " << rtol << ", scale " << scale << ")";
}
void expect_close(const std::vector<float>& got, const Vec& want, double rtol,
                  const std::string& what) {
  expect_close(to_double(got), want, rtol, what);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Central differences in float64 of the scalar f at x, one coordinate at a time.
Vec numeric_grad(Vec x, const std::function<double(const Vec&)>& f) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i], h = 1e-6 * std::max(1.0, std::fabs(xi));
    x[i] = xi + h;
    const double fp = f(x);
    x[i] = xi - h;
    const double fm = f(x);
    x[i] = xi;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

constexpr double kFwdTol = 1e-5;   // fp32 op vs float64 reference
constexpr double kGradTol = 1e-5;  // fp32 backward vs float64 analytic gradient
constexpr double kFdTol = 1e-4;    // fp32 backward vs float64 central differences

// ---- a device, a stream and transfer helpers -------------------------------------------------

struct Env {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> stream;

  explicit Env(int threads = 2, std::size_t capacity = 0)
      : dev(zo::dev::make_host_device(HostDeviceOptions{capacity, threads})),
        stream(dev->create_stream()) {}
  Stream& s() { return *stream; }

  template <class T>
  Buffer up(const std::vector<T>& v) {
    Buffer b = dev->alloc(v.size() * sizeof(T), "test input");
    dev->copy_to_device(b.data(), v.data(), v.size() * sizeof(T), s());
    stream->synchronize();
    return b;
  }
  template <class T = float>
  Buffer empty(std::size_t n) {
    return dev->alloc(n * sizeof(T), "test output");
  }
  template <class T = float>
  std::vector<T> down(const Buffer& b) {
    std::vector<T> v(b.bytes() / sizeof(T));
    dev->copy_to_host(v.data(), b.data(), b.bytes(), s());
    stream->synchronize();
    return v;
  }
};

// ---- float64 references ------------------------------------------------------------------------

Vec ref_embedding(const std::vector<std::int32_t>& tok, const Vec& wte, const Vec& wpe, int B,
                  int T, int C) {
  Vec out(std::size_t(B) * T * C);
  for (int n = 0; n < B * T; ++n) {
    for (int c = 0; c < C; ++c)
      out[n * C + c] = wte[tok[n] * C + c] + wpe[(n % T) * C + c];
  }
  return out;
}

struct LnRef {
  Vec out, mean, rstd;
};
LnRef ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int N, int C) {
  LnRef r{Vec(x.size()), Vec(N), Vec(N)};
  for (int n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c)
      m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c)
      v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c)
      r.out[n * C + c] = (x[n * C + c] - m) * rs * w[c] + b[c];
    r.mean[n] = m;
    r.rstd[n] = rs;
  }
  return r;
}

// Full Jacobian of the normalisation, d xhat_i / d x_k = rstd (delta_ik - 1/C) - xhat_i xhat_k
// rstd / C, so this does not share the shortcut formula the op uses.
void ref_layernorm_backward(const Vec& dout, const Vec& x, const Vec& w, int N, int C, Vec& dx,
                            Vec& dw, Vec& db) {
  const LnRef f = ref_layernorm(x, w, Vec(C, 0.0), N, C);
  for (int n = 0; n < N; ++n) {
    const double rs = f.rstd[n];
    auto xhat = [&](int c) { return (x[n * C + c] - f.mean[n]) * rs; };
    for (int k = 0; k < C; ++k) {
      double s = 0.0;
      for (int i = 0; i < C; ++i) {
        const double jac = rs * ((i == k ? 1.0 : 0.0) - 1.0 / C) - xhat(i) * xhat(k) * rs / C;
        s += dout[n * C + i] * w[i] * jac;
      }
      dx[n * C + k] += s;
    }
    for (int c = 0; c < C; ++c) {
      dw[c] += dout[n * C + c] * xhat(c);
      db[c] += dout[n * C + c];
    }
  }
}

Vec ref_matmul(const Vec& x, const Vec& w, const Vec* bias, int N, int C, int OC) {
  Vec out(std::size_t(N) * OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = bias != nullptr ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; ++c)
        s += x[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  }
  return out;
}

void ref_matmul_backward(const Vec& dout, const Vec& x, const Vec& w, int N, int C, int OC, Vec& dx,
                         Vec& dw, Vec* db) {
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      const double g = dout[n * OC + o];
      for (int c = 0; c < C; ++c) {
        dx[n * C + c] += g * w[o * C + c];
        dw[o * C + c] += g * x[n * C + c];
      }
      if (db != nullptr) (*db)[o] += g;
    }
  }
}

const double kSqrt2OverPi = std::sqrt(2.0 / 3.14159265358979323846);
double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}
double ref_gelu_grad(double x) {
  const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

// Naive causal attention: materialises the full (T,T) probability matrix per (b,h).
struct AttnRef {
  Vec out, lse;
};
// Index of element d of head h (a query head; k and v: that of its kv head) in part 0 (q), 1 (k)
// or 2 (v) of token t of sequence b in qkv (B, T, (NH + 2 NKV) hs).
struct QkvIndex {
  int T, NH, NKV, hs;
  std::size_t operator()(int b, int t, int part, int h, int d) const {
    const int head = part == 0 ? h : (part == 1 ? NH : NH + NKV) + h / (NH / NKV);
    return (std::size_t(b) * T + t) * std::size_t(NH + 2 * NKV) * hs + std::size_t(head) * hs + d;
  }
};
QkvIndex qkv_index(const AttentionArgs& a) {
  return {a.T, a.NH, a.kv_heads(), a.head_size()};
}

AttnRef ref_attention(const Vec& qkv, const AttentionArgs& a) {
  const int B = a.B, T = a.T, NH = a.NH, hs = a.head_size(), C = a.out_width();
  const double scale = 1.0 / std::sqrt(double(hs));
  AttnRef r{Vec(std::size_t(B) * T * C, 0.0), Vec(std::size_t(B) * NH * T)};
  const QkvIndex idx = qkv_index(a);
  auto at = [&](int b, int t, int part, int h, int d) { return qkv[idx(b, t, part, h, d)]; };
  Vec s(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          double dotp = 0.0;
          for (int d = 0; d < hs; ++d)
            dotp += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          s[j] = dotp * scale;
          m = std::max(m, s[j]);
        }
        double l = 0.0;
        for (int j = 0; j <= i; ++j)
          l += std::exp(s[j] - m);
        const double lse = m + std::log(l);
        r.lse[(std::size_t(b) * NH + h) * T + i] = lse;
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - lse);
          for (int d = 0; d < hs; ++d) {
            r.out[(std::size_t(b) * T + i) * C + h * hs + d] += p * at(b, j, 2, h, d);
          }
        }
      }
    }
  }
  return r;
}

// Backprop through softmax: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik), with the sum taken over the
// probabilities (the op uses dout . out instead).
void ref_attention_backward(const Vec& dout, const Vec& qkv, const AttentionArgs& a, Vec& dqkv) {
  const int B = a.B, T = a.T, NH = a.NH, hs = a.head_size(), C = a.out_width();
  const double scale = 1.0 / std::sqrt(double(hs));
  const QkvIndex idx = qkv_index(a);
  Vec p(T), dp(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int d = 0; d < hs; ++d)
            s += qkv[idx(b, i, 0, h, d)] * qkv[idx(b, j, 1, h, d)];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        double l = 0.0;
        for (int j = 0; j <= i; ++j)
          l += std::exp(p[j] - m);
        double pdp = 0.0;
        for (int j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - m) / l;
          dp[j] = 0.0;
          for (int d = 0; d < hs; ++d) {
            dp[j] += dout[(std::size_t(b) * T + i) * C + h * hs + d] * qkv[idx(b, j, 2, h, d)];
          }
          pdp += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - pdp);
          for (int d = 0; d < hs; ++d) {
            const double g = dout[(std::size_t(b) * T + i) * C + h * hs + d];
            dqkv[idx(b, i, 0, h, d)] += scale * ds * qkv[idx(b, j, 1, h, d)];
            dqkv[idx(b, j, 1, h, d)] += scale * ds * qkv[idx(b, i, 0, h, d)];
            dqkv[idx(b, j, 2, h, d)] += p[j] * g;
          }
        }
      }
    }
  }
}

// RMSNorm in float64: out = x / sqrt(mean(x^2) + eps) * w.
Vec ref_rmsnorm(const Vec& x, const Vec& w, int N, int C, double eps, Vec* rstd = nullptr) {
  Vec out(x.size());
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int c = 0; c < C; ++c)
      ss += x[n * C + c] * x[n * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c)
      out[n * C + c] = x[n * C + c] * rs * w[c];
    if (rstd != nullptr) (*rstd)[n] = rs;
  }
  return out;
}

// The full Jacobian d out_i / d x_k = w_i (rstd delta_ik - x_i x_k rstd^3 / C).
void ref_rmsnorm_backward(const Vec& dout, const Vec& x, const Vec& w, int N, int C, double eps,
                          Vec& dx, Vec& dw) {
  Vec rstd(N);
  ref_rmsnorm(x, w, N, C, eps, &rstd);
  for (int n = 0; n < N; ++n) {
    const double rs = rstd[n];
    for (int k = 0; k < C; ++k) {
      double s = 0.0;
      for (int i = 0; i < C; ++i) {
        const double jac =
            w[i] * (rs * (i == k ? 1.0 : 0.0) - x[n * C + i] * x[n * C + k] * rs * rs * rs / C);
        s += dout[n * C + i] * jac;
      }
      dx[n * C + k] += s;
    }
    for (int c = 0; c < C; ++c)
      dw[c] += dout[n * C + c] * x[n * C + c] * rs;
  }
}

// RoPE in float64: the q and k heads of every token turned by +angle (or -angle) per pair
// (i, i + hs/2), angle = t inv_freq[i]; v copied.
Vec ref_rope(const Vec& qkv, const std::vector<float>& inv_freq, const AttentionArgs& a,
             double sign) {
  Vec out = qkv;
  const int hs = a.head_size(), half = hs / 2, heads = a.NH + a.kv_heads();
  const std::size_t ld = std::size_t(a.qkv_width());
  for (int tok = 0; tok < a.B * a.T; ++tok) {
    const double t = tok % a.T;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const std::size_t p = tok * ld + std::size_t(h) * hs + i;
        const double angle = sign * t * inv_freq[i];
        out[p] = qkv[p] * std::cos(angle) - qkv[p + half] * std::sin(angle);
        out[p + half] = qkv[p + half] * std::cos(angle) + qkv[p] * std::sin(angle);
      }
    }
  }
  return out;
}

double ref_silu(double x) {
  return x / (1.0 + std::exp(-x));
}

// SwiGLU in float64 from gate_up (N, 2I) rows [gate | up].
Vec ref_swiglu(const Vec& gu, int N, int I) {
  Vec out(std::size_t(N) * I);
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < I; ++j)
      out[n * I + j] = ref_silu(gu[2 * n * I + j]) * gu[2 * n * I + I + j];
  }
  return out;
}

Vec ref_cross_entropy(const Vec& logits, const std::vector<std::int32_t>& tgt, int N, int V,
                      Vec* probs) {
  Vec loss(N);
  for (int n = 0; n < N; ++n) {
    double m = logits[n * V];
    for (int j = 1; j < V; ++j)
      m = std::max(m, logits[n * V + j]);
    double l = 0.0;
    for (int j = 0; j < V; ++j)
      l += std::exp(logits[n * V + j] - m);
    const double lse = m + std::log(l);
    loss[n] = lse - logits[n * V + tgt[n]];
    if (probs != nullptr) {
      for (int j = 0; j < V; ++j)
        (*probs)[n * V + j] = std::exp(logits[n * V + j] - lse);
    }
  }
  return loss;
}

using zo::test::ref_from_f16;
using zo::test::ref_to_bf16;
using zo::test::ref_to_f16;

// ======================================================================================
// Memory
// ======================================================================================

TEST(HostDeviceMemory, BasicsAndAlignment) {
  Env env(3);
  EXPECT_EQ(env.dev->backend(), zo::dev::Backend::kHost);
  EXPECT_EQ(env.dev->act_dtype(), DType::kF32);
  EXPECT_EQ(env.dev->name().rfind("host (fp32, ", 0), 0u) << env.dev->name();
  EXPECT_EQ(env.dev->capacity_bytes(), 0u);
  std::vector<Buffer> bufs;
  std::size_t total = 0;
  for (std::size_t bytes : {0, 1, 3, 63, 64, 65, 1000, 4097}) {
    bufs.push_back(env.dev->alloc(bytes, "odd"));
    total += bytes;
    EXPECT_NE(bufs.back().data(), nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(bufs.back().data()) % 64, 0u) << bytes;
    EXPECT_EQ(bufs.back().bytes(), bytes);
  }
  EXPECT_EQ(env.dev->used_bytes(), total);
  bufs.clear();
  EXPECT_EQ(env.dev->used_bytes(), 0u);
  auto dflt = zo::dev::make_host_device({});
  EXPECT_NE(dflt->name().find("host"), std::string::npos);
  EXPECT_THROW(zo::dev::make_host_device(HostDeviceOptions{0, -1}), std::invalid_argument);
}

TEST(HostDeviceMemory, CapacityIsEnforcedAndFreed) {
  constexpr std::size_t kMiB = 1u << 20;
  Env env(1, 3 * kMiB);
  EXPECT_EQ(env.dev->capacity_bytes(), 3 * kMiB);
  Buffer a = env.dev->alloc(2 * kMiB, "activations");
  EXPECT_EQ(env.dev->used_bytes(), 2 * kMiB);
  try {
    Buffer b = env.dev->alloc(3 * kMiB / 2, "layer 7 weights");
    FAIL() << "allocation past capacity succeeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 3 * kMiB / 2);
    EXPECT_EQ(e.in_use(), 2 * kMiB);
    EXPECT_EQ(e.capacity(), 3 * kMiB);
    const std::string msg = e.what();
    for (const char* part : {"layer 7 weights", "1.50 MiB", "2.00 MiB", "3.00 MiB", "--micro-batch",
                             "--recompute", "--device-memory"}) {
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
    }
  }
  EXPECT_EQ(env.dev->used_bytes(), 2 * kMiB) << "a failed allocation must not count";
  Buffer exact = env.dev->alloc(kMiB, "fills the rest exactly");
  EXPECT_EQ(env.dev->used_bytes(), 3 * kMiB);
  EXPECT_THROW(env.dev->alloc(1, "one more byte"), OutOfMemoryError);
  a.reset();
  EXPECT_EQ(env.dev->used_bytes(), kMiB);
  Buffer c = env.dev->alloc(2 * kMiB, "after free");  // freeing returned the capacity
  EXPECT_EQ(env.dev->used_bytes(), 3 * kMiB);
  EXPECT_THROW(env.dev->alloc(std::numeric_limits<std::size_t>::max(), "huge"), OutOfMemoryError);
}

TEST(HostDeviceMemory, BufferMoveSemantics) {
  Env env;
  Buffer a = env.dev->alloc(100, "a");
  void* pa = a.data();
  Buffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(b.data(), pa);
  Buffer c = env.dev->alloc(50, "c");
  EXPECT_EQ(env.dev->used_bytes(), 150u);
  c = std::move(b);  // releases c's old 50 bytes
  EXPECT_EQ(env.dev->used_bytes(), 100u);
  EXPECT_EQ(c.data(), pa);
  Buffer& same = c;     // (through a reference: clang warns of a written self-move)
  c = std::move(same);  // self-move keeps the allocation
  EXPECT_EQ(c.data(), pa);
  c.reset();
  c.reset();
  EXPECT_EQ(env.dev->used_bytes(), 0u);
}

// ======================================================================================
// Streams, events, copies, errors
// ======================================================================================

TEST(HostStreams, CopiesAndFillZero) {
  Env env;
  const std::vector<float> src = uniform(1001, 1);
  Buffer a = env.up(src);
  Buffer b = env.empty(1001);
  env.dev->copy_on_device(b.data(), a.data(), a.bytes(), env.s());
  EXPECT_TRUE(same_bits(env.down(b), src));
  env.dev->fill_zero(b.as<float>() + 10, 20 * sizeof(float), env.s());
  const std::vector<float> z = env.down(b);
  for (std::size_t i = 0; i < z.size(); ++i)
    EXPECT_EQ(z[i], i >= 10 && i < 30 ? 0.0f : src[i]);
  // Zero-byte transfers are valid no-ops, even with null pointers.
  env.dev->copy_to_device(nullptr, nullptr, 0, env.s());
  env.dev->fill_zero(nullptr, 0, env.s());
  env.stream->synchronize();
}

TEST(HostStreams, TasksRunInFifoOrder) {
  Env env;
  auto& hs = dynamic_cast<HostStream&>(env.s());
  std::vector<int> order;  // touched only by the worker until synchronize()
  for (int i = 0; i < 200; ++i)
    hs.enqueue([&order, i] { order.push_back(i); });
  env.stream->synchronize();
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(order[i], i);

  // The same through ops: each copy overwrites one value, each accumulate adds one.
  std::vector<float> values(50);
  for (int i = 0; i < 50; ++i)
    values[i] = float(i) + 0.5f;
  Buffer x = env.empty(1);
  for (const float& v : values)
    env.dev->copy_to_device(x.data(), &v, sizeof(float), env.s());
  const std::vector<float> one{1.0f};
  Buffer ones = env.up(one);
  for (int i = 0; i < 10; ++i)
    env.dev->accumulate(x.data(), ones.data(), 1, env.s());
  EXPECT_EQ(env.down(x)[0], 49.5f + 10.0f);
}

TEST(HostStreams, StreamsRunConcurrently) {
  Env env;
  auto s2 = env.dev->create_stream();
  std::promise<void> from_b;
  std::future<void> at_a = from_b.get_future();
  std::atomic<bool> a_saw_b{false};
  // A blocks until B's task runs: this only finishes quickly if the streams overlap.
  dynamic_cast<HostStream&>(env.s()).enqueue(
      [&] { a_saw_b = at_a.wait_for(std::chrono::seconds(20)) == std::future_status::ready; });
  dynamic_cast<HostStream&>(*s2).enqueue([&] { from_b.set_value(); });
  env.stream->synchronize();
  s2->synchronize();
  EXPECT_TRUE(a_saw_b);
}

TEST(HostEvents, WaitOrdersAnotherStream) {
  Env env;
  auto sb = env.dev->create_stream();
  auto e = env.dev->create_event();
  auto& a = dynamic_cast<HostStream&>(env.s());
  auto& b = dynamic_cast<HostStream&>(*sb);
  int value = 0, seen = -1;  // plain ints: ThreadSanitizer checks the event edge
  a.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    value = 42;
  });
  env.dev->record(*e, a);
  env.dev->wait(b, *e);
  b.enqueue([&] { seen = value; });
  sb->synchronize();
  EXPECT_EQ(seen, 42);
  env.stream->synchronize();

  // Public API only: a large device copy on A, then B reads the destination after the event.
  const std::size_t n = std::size_t{4} << 20;  // 16 MiB: slow enough to race without the wait
  std::vector<float> src(n);
  for (std::size_t i = 0; i < n; ++i)
    src[i] = float(i % 9973) + 0.25f;
  Buffer d_src = env.up(src), d_dst = env.empty(n);
  env.dev->fill_zero(d_dst.data(), d_dst.bytes(), *sb);
  sb->synchronize();
  std::vector<float> back(n, -1.0f);
  env.dev->copy_on_device(d_dst.data(), d_src.data(), d_src.bytes(), a);
  env.dev->record(*e, a);  // re-recording the same event
  env.dev->wait(b, *e);
  env.dev->copy_to_host(back.data(), d_dst.data(), d_dst.bytes(), b);
  sb->synchronize();
  EXPECT_TRUE(same_bits(back, src));
}

TEST(HostEvents, NeverRecordedEventIsANoOp) {
  Env env;
  auto e = env.dev->create_event();
  EXPECT_TRUE(e->query());
  e->synchronize();  // returns at once
  env.dev->wait(env.s(), *e);
  bool ran = false;
  dynamic_cast<HostStream&>(env.s()).enqueue([&] { ran = true; });
  env.stream->synchronize();
  EXPECT_TRUE(ran);
  auto e2 = env.dev->create_event();
  EXPECT_THROW(e->elapsed_ms_since(*e2), std::logic_error);
}

// The trace's clock: an event recorded after the clock exists maps to a host time no earlier than
// when the host recorded it, even when the stream was busy as the clock was made (a clock
// anchored before the stream reached its origin placed every device span early).
TEST(HostEvents, EventClockNeverPlacesWorkBeforeItWasEnqueued) {
  auto dev = zo::dev::make_host_device({});
  auto s = dev->create_stream();
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto now_us = [&] {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };
  dynamic_cast<HostStream&>(*s).enqueue(
      [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
  const zo::dev::EventClock clock(*dev, *s, now_us);
  auto e = dev->create_event();
  const double recorded_at = now_us();
  dev->record(*e, *s);
  e->synchronize();
  EXPECT_GE(clock.us(*e), recorded_at);
  EXPECT_LT(clock.us(*e), recorded_at + 20000.0) << "placed far later than it ran";
}

TEST(HostEvents, QuerySynchronizeAndElapsed) {
  Env env;
  auto& a = dynamic_cast<HostStream&>(env.s());
  auto start = env.dev->create_event(), stop = env.dev->create_event();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  env.dev->record(*start, a);
  a.enqueue([opened] { opened.wait(); });
  a.enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  env.dev->record(*stop, a);
  EXPECT_FALSE(stop->query());
  EXPECT_THROW(stop->elapsed_ms_since(*start), std::logic_error);  // not completed yet
  gate.set_value();
  stop->synchronize();
  EXPECT_TRUE(stop->query());
  EXPECT_TRUE(start->query());
  const double ms = stop->elapsed_ms_since(*start);
  EXPECT_GE(ms, 19.0);  // at least the 20 ms sleep between the markers
  EXPECT_LE(start->elapsed_ms_since(*start), 0.0);
  EXPECT_GE(start->elapsed_ms_since(*start), 0.0);
}

TEST(HostEvents, WaitUsesTheLatestRecording) {
  Env env;
  auto sb = env.dev->create_stream();
  auto& a = dynamic_cast<HostStream&>(env.s());
  auto& b = dynamic_cast<HostStream&>(*sb);
  auto e = env.dev->create_event();
  env.dev->record(*e, a);
  env.stream->synchronize();  // generation 1 done
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  a.enqueue([opened] { opened.wait(); });
  env.dev->record(*e, a);  // generation 2, blocked behind the gate
  env.dev->wait(b, *e);
  std::atomic<bool> b_ran{false};
  b.enqueue([&] { b_ran = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(b_ran) << "B ran before the latest recording of the event completed";
  EXPECT_FALSE(e->query());
  gate.set_value();
  sb->synchronize();
  EXPECT_TRUE(b_ran);
  EXPECT_TRUE(e->query());
}

TEST(HostStreams, TaskErrorSurfacesAtSynchronizeOnce) {
  Env env;
  auto sb = env.dev->create_stream();
  auto e = env.dev->create_event();
  const std::vector<std::int32_t> tokens{3, -1, 2};  // -1 is only visible inside the task
  const std::vector<float> wte = uniform(4 * 5, 2), wpe = uniform(3 * 5, 3);
  Buffer d_tok = env.up(tokens), d_wte = env.up(wte), d_wpe = env.up(wpe), out = env.empty(15);
  Buffer flag = env.up(std::vector<float>{7.0f});
  const std::vector<float> sentinel{123.0f};
  env.dev->embedding_forward(out.data(), d_tok.as<std::int32_t>(), d_wte.data(), d_wpe.data(), 1, 3,
                             5, env.s());  // returns: the error is in the data
  env.dev->copy_to_device(flag.data(), sentinel.data(), sizeof(float), env.s());  // skipped
  env.dev->record(*e, env.s());  // markers still complete after an error
  env.dev->wait(*sb, *e);
  sb->synchronize();  // would hang if the marker had been skipped
  try {
    env.stream->synchronize();
    FAIL() << "the task's exception was not rethrown";
  } catch (const std::out_of_range& err) {
    EXPECT_NE(std::string(err.what()).find("token id -1 at row 1"), std::string::npos)
        << err.what();
  }
  EXPECT_NO_THROW(env.stream->synchronize());  // reported once
  EXPECT_EQ(env.down(flag)[0], 7.0f) << "a task after the failing one ran";
  env.dev->copy_to_device(flag.data(), sentinel.data(), sizeof(float), env.s());
  EXPECT_EQ(env.down(flag)[0], 123.0f) << "the stream did not recover after reporting";

  // Any exception type from any task, and a bad cross-entropy target.
  dynamic_cast<HostStream&>(env.s()).enqueue([] { throw std::runtime_error("boom"); });
  EXPECT_THROW(env.stream->synchronize(), std::runtime_error);
  const std::vector<std::int32_t> targets{0, 5};
  Buffer d_tgt = env.up(targets), logits = env.up(uniform(10, 4)), losses = env.empty(2);
  env.dev->cross_entropy(losses.as<float>(), nullptr, logits.data(), d_tgt.as<std::int32_t>(), 2, 5,
                         5, 1.0f, env.s());
  EXPECT_THROW(env.stream->synchronize(), std::out_of_range);
}

TEST(HostStreams, DestructorSwallowsUnreportedErrors) {
  Env env;
  auto s = env.dev->create_stream();
  bool later_ran = false;
  dynamic_cast<HostStream&>(*s).enqueue([] { throw std::runtime_error("never synchronized"); });
  dynamic_cast<HostStream&>(*s).enqueue([&] { later_ran = true; });
  EXPECT_NO_THROW(s.reset());  // drains, joins, prints a warning
  EXPECT_FALSE(later_ran);
}

TEST(HostDeviceArgs, InvalidArgumentsThrowAtTheCall) {
  Env env;
  Buffer a = env.empty(64), b = env.empty(64), c = env.empty(64);
  float* f = a.as<float>();
  auto& s = env.s();
  EXPECT_THROW(env.dev->matmul_forward(f, f, f, nullptr, MatmulArgs{0, 4, 4}, s),
               std::invalid_argument);
  EXPECT_THROW(env.dev->matmul_forward(f, nullptr, f, nullptr, MatmulArgs{2, 4, 4}, s),
               std::invalid_argument);
  EXPECT_THROW(env.dev->matmul_backward(f, nullptr, f, f, f, f, MatmulArgs{2, 4, 4}, s),
               std::invalid_argument);
  try {
    env.dev->attention_forward(f, f, f, AttentionArgs{1, 2, 10, 3}, s);
    FAIL() << "C % NH != 0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("NH = 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(env.dev->attention_forward(f, f, f, AttentionArgs{1, 2, 12, 6, 4}, s),
               std::invalid_argument);  // NH % NKV != 0
  EXPECT_THROW(env.dev->rope_forward(f, f, AttentionArgs{1, 2, 1, 2, 1, 5}, s),
               std::invalid_argument);  // odd head size
  EXPECT_THROW(env.dev->rmsnorm_forward(f, f, f, nullptr, 2, 4, 1e-5f, s), std::invalid_argument);
  EXPECT_THROW(env.dev->rmsnorm_forward(f, f, f, f, 2, 4, -1.0f, s), std::invalid_argument);
  EXPECT_THROW(env.dev->swiglu_forward(f, f, 2, 0, s), std::invalid_argument);
  EXPECT_THROW(env.dev->layernorm_forward(f, f, f, f, f, f, 3, -1, s), std::invalid_argument);
  EXPECT_THROW(env.dev->embedding_forward(f, nullptr, f, f, 1, 1, 1, s), std::invalid_argument);
  EXPECT_THROW(env.dev->cross_entropy(f, nullptr, f, nullptr, 1, 3, 3, 1.0f, s),
               std::invalid_argument);
  const auto* ids = reinterpret_cast<const std::int32_t*>(f);
  EXPECT_THROW(env.dev->cross_entropy(f, nullptr, f, ids, 1, 3, 2, 1.0f, s), std::invalid_argument);
  EXPECT_THROW(env.dev->matmul_forward(f, f, f, nullptr, MatmulArgs{2, 4, 4, 3}, s),
               std::invalid_argument);
  EXPECT_THROW(env.dev->matmul_gelu_forward(f, f, f, f, nullptr, MatmulArgs{2, 4, 4, 8}, s),
               std::invalid_argument);
  EXPECT_THROW(env.dev->gelu_forward(nullptr, f, 3, s), std::invalid_argument);
  EXPECT_THROW(env.dev->cast(f, static_cast<DType>(9), f, DType::kF32, 3, s),
               std::invalid_argument);
  EXPECT_THROW(env.dev->copy_on_device(nullptr, f, 4, s), std::invalid_argument);
  // A stream or event from another backend is rejected, not dereferenced.
  struct ForeignStream : Stream {
    void synchronize() override {}
  } foreign;
  EXPECT_THROW(env.dev->fill_zero(f, 4, foreign), std::invalid_argument);
  EXPECT_NO_THROW(env.stream->synchronize());  // nothing bad was enqueued
  (void)b;
  (void)c;
}

// ======================================================================================
// Ops against float64 references and finite differences
// ======================================================================================

TEST(HostOps, EmbeddingForward) {
  constexpr int B = 2, T = 7, C = 12, V = 37;
  Env env;
  std::vector<std::int32_t> tok = random_ids(B * T, V, 10);
  tok[5] = tok[0];
  tok[T + 2] = tok[0];  // repeated tokens
  const std::vector<float> wte = uniform(V * C, 11), wpe = uniform(T * C, 12);
  Buffer d_tok = env.up(tok), d_wte = env.up(wte), d_wpe = env.up(wpe), out = env.empty(B * T * C);
  env.dev->embedding_forward(out.data(), d_tok.as<std::int32_t>(), d_wte.data(), d_wpe.data(), B, T,
                             C, env.s());
  // One fp32 addition of two floats: exactly the rounded float64 sum.
  const Vec want = ref_embedding(tok, to_double(wte), to_double(wpe), B, T, C);
  const std::vector<float> got = env.down(out);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], static_cast<float>(want[i])) << i;
}

TEST(HostOps, EmbeddingBackward) {
  constexpr int B = 2, T = 7, C = 12, V = 37;
  Env env;
  std::vector<std::int32_t> tok = random_ids(B * T, V, 20);
  tok[3] = tok[1];
  tok[T + 4] = tok[1];
  tok[T + 6] = tok[1];
  const std::vector<float> w = uniform(B * T * C, 21);  // dout = dL/dout for L = sum(w * out)
  const std::vector<float> dwte0 = uniform(V * C, 22), dwpe0 = uniform(T * C, 23);
  Buffer d_tok = env.up(tok), d_w = env.up(w), dwte = env.up(dwte0), dwpe = env.up(dwpe0);
  env.dev->embedding_backward(dwte.data(), dwpe.data(), d_w.data(), d_tok.as<std::int32_t>(), B, T,
                              C, env.s());
  const Vec got_wte = minus(env.down(dwte), dwte0), got_wpe = minus(env.down(dwpe), dwpe0);

  Vec ref_wte(V * C, 0.0), ref_wpe(T * C, 0.0);
  for (int n = 0; n < B * T; ++n) {
    for (int c = 0; c < C; ++c) {
      ref_wte[tok[n] * C + c] += w[n * C + c];
      ref_wpe[(n % T) * C + c] += w[n * C + c];
    }
  }
  expect_close(got_wte, ref_wte, kGradTol, "dwte vs analytic");
  expect_close(got_wpe, ref_wpe, kGradTol, "dwpe vs analytic");

  const Vec wd = to_double(w), wte = to_double(uniform(V * C, 24)),
            wpe = to_double(uniform(T * C, 25));
  expect_close(
      got_wte,
      numeric_grad(wte, [&](const Vec& x) { return dot(wd, ref_embedding(tok, x, wpe, B, T, C)); }),
      kFdTol, "dwte vs finite differences");
  expect_close(
      got_wpe,
      numeric_grad(wpe, [&](const Vec& x) { return dot(wd, ref_embedding(tok, wte, x, B, T, C)); }),
      kFdTol, "dwpe vs finite differences");
}

TEST(HostOps, LayerNormForward) {
  constexpr int N = 15, C = 13;
  Env env;
  const std::vector<float> x = uniform(N * C, 30, -1.5f, 2.5f);  // nonzero row means
  const std::vector<float> w = uniform(C, 31, 0.5f, 1.5f), b = uniform(C, 32);
  Buffer dx = env.up(x), dw = env.up(w), db = env.up(b), out = env.empty(N * C),
         mean = env.empty(N), rstd = env.empty(N);
  env.dev->layernorm_forward(out.data(), mean.as<float>(), rstd.as<float>(), dx.data(), dw.data(),
                             db.data(), N, C, env.s());
  const LnRef ref = ref_layernorm(to_double(x), to_double(w), to_double(b), N, C);
  expect_close(env.down(out), ref.out, kFwdTol, "layernorm out");
  expect_close(env.down(mean), ref.mean, kFwdTol, "layernorm mean");
  expect_close(env.down(rstd), ref.rstd, kFwdTol, "layernorm rstd");
}

TEST(HostOps, LayerNormBackward) {
  constexpr int N = 15, C = 13;
  Env env;
  const std::vector<float> x = uniform(N * C, 40, -1.5f, 2.5f);
  const std::vector<float> w = uniform(C, 41, 0.5f, 1.5f), b = uniform(C, 42);
  const std::vector<float> dout = uniform(N * C, 43);
  const std::vector<float> dx0 = uniform(N * C, 44), dw0 = uniform(C, 45), db0 = uniform(C, 46);
  Buffer d_x = env.up(x), d_w = env.up(w), d_b = env.up(b), d_dout = env.up(dout),
         out = env.empty(N * C), mean = env.empty(N), rstd = env.empty(N);
  env.dev->layernorm_forward(out.data(), mean.as<float>(), rstd.as<float>(), d_x.data(), d_w.data(),
                             d_b.data(), N, C, env.s());
  Buffer dx = env.up(dx0), dw = env.up(dw0), db = env.up(db0);
  env.dev->layernorm_backward(dx.data(), dx.data(), dw.data(), db.data(), d_dout.data(), d_x.data(),
                              d_w.data(), mean.as<float>(), rstd.as<float>(), N, C, env.s());
  const Vec got_x = minus(env.down(dx), dx0), got_w = minus(env.down(dw), dw0),
            got_b = minus(env.down(db), db0);

  const Vec xd = to_double(x), wd = to_double(w), bd = to_double(b), g = to_double(dout);
  Vec ref_x(N * C, 0.0), ref_w(C, 0.0), ref_b(C, 0.0);
  ref_layernorm_backward(g, xd, wd, N, C, ref_x, ref_w, ref_b);
  expect_close(got_x, ref_x, kGradTol, "layernorm dinp vs analytic");
  expect_close(got_w, ref_w, kGradTol, "layernorm dweight vs analytic");
  expect_close(got_b, ref_b, kGradTol, "layernorm dbias vs analytic");

  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    return dot(g, ref_layernorm(xx, ww, bb, N, C).out);
  };
  expect_close(got_x, numeric_grad(xd, [&](const Vec& v) { return loss(v, wd, bd); }), kFdTol,
               "layernorm dinp vs finite differences");
  expect_close(got_w, numeric_grad(wd, [&](const Vec& v) { return loss(xd, v, bd); }), kFdTol,
               "layernorm dweight vs finite differences");
  expect_close(got_b, numeric_grad(bd, [&](const Vec& v) { return loss(xd, wd, v); }), kFdTol,
               "layernorm dbias vs finite differences");
}

void check_matmul_forward(int N, int C, int OC, bool with_bias, int threads) {
  Env env(threads);
  const std::vector<float> x = uniform(N * C, 50), w = uniform(OC * C, 51), b = uniform(OC, 52);
  Buffer d_x = env.up(x), d_w = env.up(w), d_b = env.up(b), out = env.empty(N * OC);
  env.dev->matmul_forward(out.data(), d_x.data(), d_w.data(), with_bias ? d_b.data() : nullptr,
                          MatmulArgs{N, C, OC}, env.s());
  const Vec bd = to_double(b);
  expect_close(env.down(out),
               ref_matmul(to_double(x), to_double(w), with_bias ? &bd : nullptr, N, C, OC), kFwdTol,
               with_bias ? "matmul out (bias)" : "matmul out (no bias)");
}

TEST(HostOps, MatmulForward) {
  check_matmul_forward(15, 13, 9, true, 2);
  check_matmul_forward(15, 13, 9, false, 2);
  check_matmul_forward(1, 1, 1, true, 2);
  check_matmul_forward(130, 33, 70, true, 3);  // several row blocks and a partial one
}

void check_matmul_backward(int N, int C, int OC, bool with_bias, bool with_fd, int threads) {
  Env env(threads);
  const std::vector<float> x = uniform(N * C, 60), w = uniform(OC * C, 61), b = uniform(OC, 62);
  const std::vector<float> dout = uniform(N * OC, 63);
  const std::vector<float> dx0 = uniform(N * C, 64), dw0 = uniform(OC * C, 65),
                           db0 = uniform(OC, 66);
  Buffer d_x = env.up(x), d_w = env.up(w), d_dout = env.up(dout);
  Buffer dx = env.up(dx0), dw = env.up(dw0), db = env.up(db0);
  env.dev->matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, d_dout.data(),
                           d_x.data(), d_w.data(), MatmulArgs{N, C, OC}, env.s());
  const Vec got_x = to_double(env.down(dx)), got_w = minus(env.down(dw), dw0),
            got_b = minus(env.down(db), db0);

  const Vec xd = to_double(x), wd = to_double(w), bd = to_double(b), g = to_double(dout);
  Vec ref_x(N * C, 0.0), ref_w(OC * C, 0.0), ref_b(OC, 0.0);
  ref_matmul_backward(g, xd, wd, N, C, OC, ref_x, ref_w, &ref_b);
  expect_close(got_x, ref_x, kGradTol, "matmul dinp vs analytic");
  expect_close(got_w, ref_w, kGradTol, "matmul dweight vs analytic");
  if (with_bias) {
    expect_close(got_b, ref_b, kGradTol, "matmul dbias vs analytic");
  } else {
    EXPECT_EQ(got_b, Vec(OC, 0.0)) << "dbias written although null was passed";
  }
  if (!with_fd) return;
  auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
    return dot(g, ref_matmul(xx, ww, &bb, N, C, OC));
  };
  expect_close(got_x, numeric_grad(xd, [&](const Vec& v) { return loss(v, wd, bd); }), kFdTol,
               "matmul dinp vs finite differences");
  expect_close(got_w, numeric_grad(wd, [&](const Vec& v) { return loss(xd, v, bd); }), kFdTol,
               "matmul dweight vs finite differences");
  expect_close(got_b, numeric_grad(bd, [&](const Vec& v) { return loss(xd, wd, v); }), kFdTol,
               "matmul dbias vs finite differences");
}

TEST(HostOps, MatmulBackward) {
  check_matmul_backward(15, 13, 9, true, true, 2);
  check_matmul_backward(15, 13, 9, false, false, 2);
  check_matmul_backward(130, 33, 70, true, false, 3);  // several row and channel blocks
}

TEST(HostOps, GeluForwardAndBackward) {
  constexpr std::size_t n = 1001;
  Env env;
  std::vector<float> x = uniform(n, 70, -4.0f, 4.0f);
  x[0] = -12.0f;  // saturated tails
  x[1] = 12.0f;
  x[2] = 1e-4f;
  const std::vector<float> dout = uniform(n, 71), dx0 = uniform(n, 72);
  Buffer d_x = env.up(x), out = env.empty(n), d_dout = env.up(dout), dx = env.up(dx0);
  env.dev->gelu_forward(out.data(), d_x.data(), n, env.s());
  env.dev->gelu_backward(dx.data(), d_x.data(), d_dout.data(), n, env.s());
  const std::vector<float> got = env.down(out);
  const Vec got_dx = minus(env.down(dx), dx0);
  Vec want(n), want_dx(n), fd(n);
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = ref_gelu(x[i]);
    want_dx[i] = ref_gelu_grad(x[i]) * dout[i];
    const double h = 1e-6 * std::max(1.0, std::fabs(double{x[i]}));
    fd[i] = (ref_gelu(x[i] + h) - ref_gelu(x[i] - h)) / (2.0 * h) * dout[i];
  }
  expect_close(got, want, kFwdTol, "gelu out");
  expect_close(got_dx, want_dx, kGradTol, "gelu dinp vs analytic");
  expect_close(got_dx, fd, kFdTol, "gelu dinp vs finite differences");
}

TEST(HostOps, ResidualAndAccumulate) {
  constexpr std::size_t n = 40001;  // several blocks and a tail
  Env env(3);
  const std::vector<float> a = uniform(n, 80), b = uniform(n, 81, -3.0f, 3.0f);
  Buffer d_a = env.up(a), d_b = env.up(b), out = env.empty(n), acc = env.up(a);
  env.dev->residual_forward(out.data(), d_a.data(), d_b.data(), n, env.s());
  env.dev->accumulate(acc.data(), d_b.data(), n, env.s());
  env.dev->residual_forward(d_a.data(), d_a.data(), d_b.data(), n, env.s());  // in place
  const std::vector<float> r = env.down(out), s = env.down(acc), in_place = env.down(d_a);
  for (std::size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(double{a[i]} + double{b[i]});  // exact, then rounded
    ASSERT_EQ(r[i], want) << i;
    ASSERT_EQ(s[i], want) << i;
    ASSERT_EQ(in_place[i], want) << i;
  }
}

void check_attention(const AttentionArgs& args, bool with_fd, int threads) {
  Env env(threads);
  const int B = args.B, T = args.T, NH = args.NH, C = args.out_width();
  const std::vector<float> qkv = uniform(std::size_t(B) * T * args.qkv_width(), 90, -1.5f, 1.5f);
  const std::vector<float> dout = uniform(std::size_t(B) * T * C, 91);
  const std::vector<float> dqkv0 = uniform(qkv.size(), 92);
  Buffer d_qkv = env.up(qkv), out = env.empty(B * T * C), lse = env.empty(B * NH * T);
  Buffer d_dout = env.up(dout), dqkv = env.up(dqkv0);
  env.dev->attention_forward(out.data(), lse.as<float>(), d_qkv.data(), args, env.s());
  env.dev->attention_backward(dqkv.data(), d_dout.data(), d_qkv.data(), out.data(), lse.as<float>(),
                              args, env.s());
  const Vec qd = to_double(qkv), g = to_double(dout);
  const AttnRef ref = ref_attention(qd, args);
  expect_close(env.down(out), ref.out, kFwdTol, "attention out");
  expect_close(env.down(lse), ref.lse, kFwdTol, "attention lse");

  const Vec got = to_double(env.down(dqkv));  // written over dqkv0
  Vec want(qkv.size(), 0.0);
  ref_attention_backward(g, qd, args, want);
  expect_close(got, want, kGradTol, "attention dqkv vs analytic");
  if (with_fd) {
    expect_close(got,
                 numeric_grad(qd, [&](const Vec& v) { return dot(g, ref_attention(v, args).out); }),
                 kFdTol, "attention dqkv vs finite differences");
  }
}

TEST(HostOps, Attention) {
  check_attention({2, 7, 12, 3}, true, 2);
}
TEST(HostOps, AttentionSingleTokenAndHead) {
  check_attention({3, 1, 5, 1}, true, 2);
}
TEST(HostOps, AttentionSeveralQueryBlocks) {
  check_attention({2, 150, 32, 2}, false, 3);
}
// Grouped-query: 6 query heads over 2 and 1 kv heads, 3 over 3, head sizes apart from C / NH.
TEST(HostOps, AttentionGroupedQuery) {
  check_attention({2, 7, 1, 6, 2, 4}, true, 2);
  check_attention({1, 5, 1, 6, 1, 3}, true, 2);
  check_attention({1, 4, 1, 3, 3, 5}, true, 2);
  check_attention({2, 70, 1, 4, 2, 8}, false, 3);  // two query blocks per head
}

TEST(HostOps, RmsNormForwardAndBackward) {
  constexpr int N = 15, C = 13;
  for (const float eps : {1e-5f, 0.5f}) {
    Env env;
    const std::vector<float> x = uniform(N * C, 130, -1.5f, 2.5f);
    const std::vector<float> w = uniform(C, 131, 0.5f, 1.5f), dout = uniform(N * C, 132);
    const std::vector<float> dx0 = uniform(N * C, 133), dw0 = uniform(C, 134);
    Buffer d_x = env.up(x), d_w = env.up(w), d_dout = env.up(dout), out = env.empty(N * C),
           rstd = env.empty(N);
    env.dev->rmsnorm_forward(out.data(), rstd.as<float>(), d_x.data(), d_w.data(), N, C, eps,
                             env.s());
    const Vec xd = to_double(x), wd = to_double(w), g = to_double(dout);
    Vec ref_rstd(N);
    expect_close(env.down(out), ref_rmsnorm(xd, wd, N, C, eps, &ref_rstd), kFwdTol, "rmsnorm out");
    expect_close(env.down(rstd), ref_rstd, kFwdTol, "rmsnorm rstd");

    Buffer dx = env.up(dx0), dw = env.up(dw0);  // dinp accumulated in place, dweight +=
    env.dev->rmsnorm_backward(dx.data(), dx.data(), dw.data(), d_dout.data(), d_x.data(),
                              d_w.data(), rstd.as<float>(), N, C, env.s());
    const Vec got_x = minus(env.down(dx), dx0), got_w = minus(env.down(dw), dw0);
    Vec ref_x(N * C, 0.0), ref_w(C, 0.0);
    ref_rmsnorm_backward(g, xd, wd, N, C, eps, ref_x, ref_w);
    expect_close(got_x, ref_x, kGradTol, "rmsnorm dinp vs analytic");
    expect_close(got_w, ref_w, kGradTol, "rmsnorm dweight vs analytic");
    auto loss = [&](const Vec& xx, const Vec& ww) {
      return dot(g, ref_rmsnorm(xx, ww, N, C, eps));
    };
    expect_close(got_x, numeric_grad(xd, [&](const Vec& v) { return loss(v, wd); }), kFdTol,
                 "rmsnorm dinp vs finite differences");
    expect_close(got_w, numeric_grad(wd, [&](const Vec& v) { return loss(xd, v); }), kFdTol,
                 "rmsnorm dweight vs finite differences");

    Buffer written = env.empty(N * C);  // a null dresidual: written
    env.dev->rmsnorm_backward(written.data(), nullptr, dw.data(), d_dout.data(), d_x.data(),
                              d_w.data(), rstd.as<float>(), N, C, env.s());
    expect_close(env.down(written), ref_x, kGradTol, "rmsnorm dinp written");
  }
}

// Forward against float64 rotations, backward as the forward's transpose (<R x, y> = <x, R^T y>)
// and against rotations by -angle; t = 0 leaves its token alone.
TEST(HostOps, RopeForwardAndBackward) {
  const AttentionArgs a{2, 9, 1, 6, 2, 8};
  const std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f, 0.001f};  // hs / 2
  Env env;
  const std::size_t n = std::size_t(a.B) * a.T * a.qkv_width();
  const std::vector<float> x = uniform(n, 140), y = uniform(n, 141);
  Buffer d_f = env.up(inv_freq), d_x = env.up(x), d_y = env.up(y);
  env.dev->rope_forward(d_x.data(), d_f.as<float>(), a, env.s());
  env.dev->rope_backward(d_y.data(), d_f.as<float>(), a, env.s());
  const std::vector<float> rx = env.down(d_x), ry = env.down(d_y);
  expect_close(rx, ref_rope(to_double(x), inv_freq, a, 1.0), kFwdTol, "rope forward");
  expect_close(ry, ref_rope(to_double(y), inv_freq, a, -1.0), kFwdTol, "rope backward");
  EXPECT_NEAR(dot(to_double(rx), to_double(y)), dot(to_double(x), to_double(ry)), 1e-4)
      << "rope_backward is the transpose of rope_forward";
  for (int c = 0; c < a.qkv_width(); ++c)  // token 0 of sequence 0: angle 0
    EXPECT_EQ(rx[c], x[c]) << c;
  // Hand-checked: head 0, pair (1, 5) of token t = 3 turns by 3 * 0.3 = 0.9 rad.
  const std::size_t p = 3 * std::size_t(a.qkv_width()) + 1;
  EXPECT_NEAR(rx[p], x[p] * std::cos(0.9) - x[p + 4] * std::sin(0.9), 1e-6);
  EXPECT_NEAR(rx[p + 4], x[p + 4] * std::cos(0.9) + x[p] * std::sin(0.9), 1e-6);
}

TEST(HostOps, SwiGluForwardAndBackward) {
  constexpr int N = 5, I = 7;
  Env env;
  const std::vector<float> gu = uniform(2 * N * I, 150, -4.0f, 4.0f), dout = uniform(N * I, 151);
  Buffer d_gu = env.up(gu), d_dout = env.up(dout), out = env.empty(N * I),
         dgu = env.empty(2 * N * I);
  env.dev->swiglu_forward(out.data(), d_gu.data(), N, I, env.s());
  env.dev->swiglu_backward(dgu.data(), d_dout.data(), d_gu.data(), N, I, env.s());
  const Vec gud = to_double(gu), g = to_double(dout);
  expect_close(env.down(out), ref_swiglu(gud, N, I), kFwdTol, "swiglu out");
  Vec want(gu.size());  // silu'(x) = sigma(x) (1 + x (1 - sigma(x)))
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < I; ++j) {
      const double x = gud[2 * n * I + j], up = gud[2 * n * I + I + j];
      const double sig = 1.0 / (1.0 + std::exp(-x));
      want[2 * n * I + j] = g[n * I + j] * up * sig * (1.0 + x * (1.0 - sig));
      want[2 * n * I + I + j] = g[n * I + j] * ref_silu(x);
    }
  }
  const std::vector<float> got = env.down(dgu);
  expect_close(got, want, kGradTol, "swiglu dgate_up vs analytic");
  expect_close(got, numeric_grad(gud, [&](const Vec& v) { return dot(g, ref_swiglu(v, N, I)); }),
               kFdTol, "swiglu dgate_up vs finite differences");
}

TEST(HostOps, CrossEntropy) {
  constexpr int N = 15, V = 37;
  constexpr float kScale = 0.37f;
  Env env;
  const std::vector<float> logits = uniform(N * V, 100, -4.0f, 4.0f);
  const std::vector<std::int32_t> tgt = random_ids(N, V, 101);
  Buffer d_logits = env.up(logits), d_tgt = env.up(tgt), losses = env.empty(N),
         dlogits = env.empty(N * V);
  env.dev->cross_entropy(losses.as<float>(), dlogits.data(), d_logits.data(),
                         d_tgt.as<std::int32_t>(), N, V, V, kScale, env.s());
  const Vec ld = to_double(logits);
  Vec probs(N * V);
  const Vec want_loss = ref_cross_entropy(ld, tgt, N, V, &probs);
  const std::vector<float> got_loss = env.down(losses), got_d = env.down(dlogits);
  expect_close(got_loss, want_loss, kFwdTol, "losses");
  Vec want_d(N * V);
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < V; ++j) {
      want_d[n * V + j] = double{kScale} * (probs[n * V + j] - (j == tgt[n] ? 1.0 : 0.0));
    }
  }
  expect_close(got_d, want_d, kGradTol, "dlogits vs analytic");
  const Vec fd = numeric_grad(ld, [&](const Vec& v) {
    const Vec l = ref_cross_entropy(v, tgt, N, V, nullptr);
    return double{kScale} * dot(l, Vec(N, 1.0));
  });
  expect_close(got_d, fd, kFdTol, "dlogits vs finite differences");

  // dlogits aliasing logits gives the same bits; losses alone leave nothing else written.
  Buffer in_place = env.up(logits), losses2 = env.empty(N), losses3 = env.empty(N);
  env.dev->cross_entropy(losses2.as<float>(), in_place.data(), in_place.data(),
                         d_tgt.as<std::int32_t>(), N, V, V, kScale, env.s());
  EXPECT_TRUE(same_bits(env.down(in_place), got_d));
  EXPECT_TRUE(same_bits(env.down(losses2), got_loss));
  env.dev->cross_entropy(losses3.as<float>(), nullptr, d_logits.data(), d_tgt.as<std::int32_t>(), N,
                         V, V, kScale, env.s());
  EXPECT_TRUE(same_bits(env.down(losses3), got_loss));
  EXPECT_TRUE(same_bits(env.down(d_logits), logits));
}

TEST(HostOps, CrossEntropyIsStableForLargeLogits) {
  constexpr int N = 3, V = 11;
  Env env;
  std::vector<float> logits = uniform(N * V, 110, -2.0f, 2.0f);
  for (int j = 0; j < V; ++j)
    logits[j] += 1000.0f;  // row 0 shifted up
  for (int j = 0; j < V; ++j)
    logits[V + j] -= 1000.0f;  // row 1 shifted down
  logits[2 * V + 4] = 200.0f;  // row 2 one dominant class
  const std::vector<std::int32_t> tgt{3, 7, 5};
  Buffer d_logits = env.up(logits), d_tgt = env.up(tgt), losses = env.empty(N),
         dlogits = env.empty(N * V);
  env.dev->cross_entropy(losses.as<float>(), dlogits.data(), d_logits.data(),
                         d_tgt.as<std::int32_t>(), N, V, V, 1.0f, env.s());
  const std::vector<float> got = env.down(losses), d = env.down(dlogits);
  for (float x : got)
    EXPECT_TRUE(std::isfinite(x));
  for (float x : d)
    EXPECT_TRUE(std::isfinite(x));
  const Vec want = ref_cross_entropy(to_double(logits), tgt, N, V, nullptr);
  expect_close(got, want, 1e-4, "losses with large logits");  // inputs near 1000 carry 6e-5 ulps
  EXPECT_NEAR(d[2 * V + 4], 1.0f, 1e-6f);  // softmax ~ one-hot on class 4, target 5
  EXPECT_NEAR(d[2 * V + 5], -1.0f, 1e-6f);
  EXPECT_NEAR(d[2 * V + 6], 0.0f, 1e-30f);
}

TEST(HostOps, SumSquares) {
  constexpr std::size_t n = 100003;
  Env env(3);
  const std::vector<float> x = uniform(n, 120, -2.0f, 2.0f);
  Buffer d_x = env.up(x), out = env.up(std::vector<float>{1.25f});
  env.dev->sum_squares(out.as<float>(), d_x.data(), n, env.s());
  env.dev->sum_squares(out.as<float>(), d_x.data(), 5, env.s());  // accumulates, short tail
  double want = 1.25;
  for (float v : x)
    want += double{v} * v;
  for (std::size_t i = 0; i < 5; ++i)
    want += double{x[i]} * x[i];
  expect_close(env.down(out), Vec{want}, 1e-6, "sum of squares");
}

TEST(HostOps, NonfiniteFlag) {
  constexpr std::size_t n = 50001;
  Env env(3);
  std::vector<float> x = uniform(n, 130, -1e30f, 1e30f);
  Buffer d_x = env.up(x), flag = env.up(std::vector<float>{0.0f});
  env.dev->nonfinite_flag(flag.as<float>(), d_x.data(), n, env.s());
  EXPECT_EQ(env.down(flag)[0], 0.0f) << "finite data raised the flag";
  Buffer raised = env.up(std::vector<float>{1.0f});
  env.dev->nonfinite_flag(raised.as<float>(), d_x.data(), n, env.s());
  EXPECT_EQ(env.down(raised)[0], 1.0f) << "the flag must be left as is, not cleared";
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (std::size_t pos : {std::size_t{0}, std::size_t{20000}, n - 1}) {
      std::vector<float> y = x;
      y[pos] = bad;
      Buffer d_y = env.up(y), f = env.up(std::vector<float>{0.0f});
      env.dev->nonfinite_flag(f.as<float>(), d_y.data(), n, env.s());
      EXPECT_EQ(env.down(f)[0], 1.0f) << bad << " at " << pos;
    }
  }
}

TEST(HostOps, Cast) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Env env;
  std::vector<float> x = uniform(1001, 140, -70000.0f, 70000.0f);
  const std::vector<float> small = uniform(200, 141, -1e-3f, 1e-3f);
  std::copy(small.begin(), small.end(), x.begin() + 100);
  x[0] = kInf;
  x[1] = -kInf;
  x[2] = 1e-7f;                              // fp16 subnormal
  x[3] = 65520.0f;                           // rounds to fp16 infinity
  x[4] = 1.0f + 1.0f / 2048.0f;              // fp16 tie: to even
  x[5] = std::bit_cast<float>(0x3f808000u);  // bf16 tie: to even
  x[6] = 3.0e38f;                            // near float max
  x[7] = -0.0f;
  const std::size_t n = x.size();
  Buffer d_x = env.up(x), h = env.empty<std::uint16_t>(n), bf = env.empty<std::uint16_t>(n),
         back_h = env.empty(n), back_bf = env.empty(n), copy = env.empty(n);
  env.dev->cast(h.data(), DType::kF16, d_x.data(), DType::kF32, n, env.s());
  env.dev->cast(bf.data(), DType::kBF16, d_x.data(), DType::kF32, n, env.s());
  env.dev->cast(back_h.data(), DType::kF32, h.data(), DType::kF16, n, env.s());
  env.dev->cast(back_bf.data(), DType::kF32, bf.data(), DType::kBF16, n, env.s());
  env.dev->cast(copy.data(), DType::kF32, d_x.data(), DType::kF32, n, env.s());
  const auto got_h = env.down<std::uint16_t>(h), got_bf = env.down<std::uint16_t>(bf);
  const auto got_back_h = env.down(back_h), got_back_bf = env.down(back_bf);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got_h[i], ref_to_f16(x[i])) << i << ": " << x[i];
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got_back_h[i]),
              std::bit_cast<std::uint32_t>(ref_from_f16(got_h[i])));
    if (std::isfinite(x[i])) {
      ASSERT_EQ(got_bf[i], ref_to_bf16(x[i])) << i << ": " << x[i];
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got_back_bf[i]), std::uint32_t{got_bf[i]} << 16);
  }
  EXPECT_EQ(got_bf[0], 0x7f80u);
  EXPECT_EQ(got_bf[1], 0xff80u);
  EXPECT_TRUE(same_bits(env.down(copy), x));
  // NaN stays NaN both ways.
  Buffer nan = env.up(std::vector<float>{std::numeric_limits<float>::quiet_NaN()});
  Buffer nan16 = env.empty<std::uint16_t>(1), nan_back = env.empty(1);
  env.dev->cast(nan16.data(), DType::kBF16, nan.data(), DType::kF32, 1, env.s());
  env.dev->cast(nan_back.data(), DType::kF32, nan16.data(), DType::kBF16, 1, env.s());
  EXPECT_TRUE(std::isnan(env.down(nan_back)[0]));
}

// ======================================================================================
// Determinism: the op-case table (op_cases.h) on 3 threads against 1 thread, bit for bit
// ======================================================================================

class HostOpCases : public ::testing::TestWithParam<zo::test::OpCaseParam> {};

TEST_P(HostOpCases, SameBitsOnThreeThreadsAsOnOne) {
  const auto one = zo::dev::make_host_device(HostDeviceOptions{0, 1});
  const auto three = zo::dev::make_host_device(HostDeviceOptions{0, 3});
  zo::test::run_op_case(*GetParam().op, DType::kF32, *three, *one, zo::test::Compare::kBits);
}

INSTANTIATE_TEST_SUITE_P(Table, HostOpCases,
                         ::testing::ValuesIn(zo::test::op_case_params({DType::kF32})),
                         zo::test::op_case_name);

// The device AdamW (resident mode) against the documented update in float64, 10 steps.
TEST(HostOps, AdamWMatchesFloat64Reference) {
  auto dev = zo::dev::make_host_device({});
  auto s = dev->create_stream();
  const std::size_t n = 1031;
  std::mt19937 rng(77);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), m(n), v(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    m[i] = 0.01f * normal(rng);
    v[i] = 1e-4f * std::fabs(normal(rng));
  }
  std::vector<double> pd(p.begin(), p.end()), md(m.begin(), m.end()), vd(v.begin(), v.end());
  Buffer bp = dev->alloc(n * 4, "p"), bm = dev->alloc(n * 4, "m"), bv = dev->alloc(n * 4, "v"),
         bg = dev->alloc(n * 4, "g"), bout = dev->alloc(n * 4, "out");
  dev->copy_to_device(bp.data(), p.data(), n * 4, *s);
  dev->copy_to_device(bm.data(), m.data(), n * 4, *s);
  dev->copy_to_device(bv.data(), v.data(), n * 4, *s);
  zo::AdamConfig a;
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.weight_decay = 0.1f;
  const float grad_mult = 0.5f;
  for (std::int64_t t = 1; t <= 10; ++t) {
    for (auto& x : g)
      x = normal(rng);
    dev->copy_to_device(bg.data(), g.data(), n * 4, *s);
    dev->adamw(bp.as<float>(), bm.as<float>(), bv.as<float>(), bg.data(), bout.data(), n, a, t,
               grad_mult, nullptr, 0, nullptr, *s);
    s->synchronize();  // g is rewritten next iteration
    const double b1 = a.beta1, b2 = a.beta2;
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = double(g[i]) * grad_mult;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
      pd[i] = pd[i] * (1 - double(a.lr) * a.weight_decay) -
              a.lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + a.eps);
    }
  }
  std::vector<float> out(n), master(n);
  dev->copy_to_host(out.data(), bout.data(), n * 4, *s);
  dev->copy_to_host(master.data(), bp.data(), n * 4, *s);
  s->synchronize();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(master[i], pd[i], 1e-5 * std::fabs(pd[i]) + 1e-6) << i;
    ASSERT_EQ(out[i], master[i]) << "params_out is the fp32 master on the host backend";
  }
  EXPECT_THROW(dev->adamw(bp.as<float>(), bm.as<float>(), bv.as<float>(), bg.data(), nullptr, n, a,
                          0, grad_mult, nullptr, 0, nullptr, *s),
               std::invalid_argument);
  a.decoupled_weight_decay = false;  // the device AdamW is AdamW only
  EXPECT_THROW(dev->adamw(bp.as<float>(), bm.as<float>(), bv.as<float>(), bg.data(), nullptr, n, a,
                          1, grad_mult, nullptr, 0, nullptr, *s),
               std::invalid_argument);
}

// ---- fused ops and padded rows: the unfused host sequence, bit for bit -------------------------

// What the model computed before the fusions (and before activation gradients were written
// instead of accumulated into zero-filled buffers), against the fused ops: the same bits, which is
// what keeps the pinned trainer losses (test_train, test_data_parallel) unchanged.
TEST(HostOps, FusedOpsEqualTheUnfusedSequenceBitForBit) {
  constexpr int N = 70, C = 24, OC = 40;  // two host GEMM row blocks
  constexpr std::size_t NC = std::size_t(N) * C, NO = std::size_t(N) * OC;
  Env env(3);
  auto down = [&](const Buffer& b) { return env.down(b); };
  auto zeroed = [&](std::size_t n) {
    Buffer b = env.empty(n);
    env.dev->fill_zero(b.data(), n * 4, env.s());
    return b;
  };
  // residual_layernorm_forward = residual_forward, then layernorm_forward.
  Buffer a = env.up(uniform(NC, 120, -2.0f, 2.0f)), b = env.up(uniform(NC, 121));
  Buffer w = env.up(uniform(C, 122, 0.5f, 1.5f)), bias = env.up(uniform(C, 123));
  Buffer res = env.empty(NC), out = env.empty(NC), mean = env.empty(N), rstd = env.empty(N);
  Buffer res2 = env.empty(NC), out2 = env.empty(NC), mean2 = env.empty(N), rstd2 = env.empty(N);
  env.dev->residual_layernorm_forward(res.data(), out.data(), mean.as<float>(), rstd.as<float>(),
                                      a.data(), b.data(), w.data(), bias.data(), N, C, env.s());
  env.dev->residual_forward(res2.data(), a.data(), b.data(), NC, env.s());
  env.dev->layernorm_forward(out2.data(), mean2.as<float>(), rstd2.as<float>(), res2.data(),
                             w.data(), bias.data(), N, C, env.s());
  EXPECT_TRUE(same_bits(down(res), down(res2)));
  EXPECT_TRUE(same_bits(down(out), down(out2)));
  EXPECT_TRUE(same_bits(down(mean), down(mean2)));
  EXPECT_TRUE(same_bits(down(rstd), down(rstd2)));

  // matmul_gelu_forward = matmul_forward, then gelu_forward.
  Buffer x = env.up(uniform(NC, 124)), wf = env.up(uniform(std::size_t(OC) * C, 125)),
         bf = env.up(uniform(OC, 126));
  Buffer act = env.empty(NO), pre = env.empty(NO), act2 = env.empty(NO), pre2 = env.empty(NO);
  env.dev->matmul_gelu_forward(act.data(), pre.data(), x.data(), wf.data(), bf.data(), {N, C, OC},
                               env.s());
  env.dev->matmul_forward(pre2.data(), x.data(), wf.data(), bf.data(), {N, C, OC}, env.s());
  env.dev->gelu_forward(act2.data(), pre2.data(), NO, env.s());
  EXPECT_TRUE(same_bits(down(pre), down(pre2)));
  EXPECT_TRUE(same_bits(down(act), down(act2)));

  // matmul_dgelu_backward = the input gradient accumulated into zeros, then gelu_backward into
  // zeros; the parameter gradients accumulate as before.
  const std::vector<float> dw0 = uniform(std::size_t(OC) * C, 127), db0 = uniform(OC, 128);
  Buffer dout = env.up(uniform(NO, 129)), inp = env.up(uniform(NC, 130));
  Buffer gpre = env.up(uniform(NC, 131, -4.0f, 4.0f));
  Buffer dpre = env.up(uniform(NC, 132)), dw = env.up(dw0), db = env.up(db0);
  Buffer tmp = zeroed(NC), dpre2 = zeroed(NC), dw2 = env.up(dw0), db2 = env.up(db0);
  env.dev->matmul_dgelu_backward(dpre.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                 wf.data(), gpre.data(), {N, C, OC}, env.s());
  env.dev->matmul_backward(tmp.data(), dw2.data(), db2.data(), dout.data(), inp.data(), wf.data(),
                           {N, C, OC}, env.s());
  env.dev->gelu_backward(dpre2.data(), gpre.data(), tmp.data(), NC, env.s());
  EXPECT_TRUE(same_bits(down(dpre), down(dpre2)));
  EXPECT_TRUE(same_bits(down(dw), down(dw2)));
  EXPECT_TRUE(same_bits(down(db), down(db2)));

  // layernorm_backward written = accumulated in place into a zero-filled buffer.
  Buffer lw = env.up(uniform(C, 133)), lb = env.up(uniform(C, 134)), lout = env.empty(NC);
  env.dev->layernorm_forward(lout.data(), mean.as<float>(), rstd.as<float>(), x.data(), w.data(),
                             bias.data(), N, C, env.s());
  Buffer dx = env.up(uniform(NC, 135)), dx2 = zeroed(NC), lw2 = env.up(down(lw)),
         lb2 = env.up(down(lb));
  env.dev->layernorm_backward(dx.data(), nullptr, lw.data(), lb.data(), a.data(), x.data(),
                              w.data(), mean.as<float>(), rstd.as<float>(), N, C, env.s());
  env.dev->layernorm_backward(dx2.data(), dx2.data(), lw2.data(), lb2.data(), a.data(), x.data(),
                              w.data(), mean.as<float>(), rstd.as<float>(), N, C, env.s());
  EXPECT_TRUE(same_bits(down(dx), down(dx2)));
  EXPECT_TRUE(same_bits(down(lw), down(lw2)));
  EXPECT_TRUE(same_bits(down(lb), down(lb2)));
}

// Rows `ld` apart (the LM head's padding on CUDA): the results of packed rows, bit for bit; the
// padding (NaN in inputs) never read, and left as it was in outputs.
TEST(HostOps, PaddedRowsAreNeitherReadNorWritten) {
  constexpr int N = 9, C = 16, V = 21, ld = 32;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Env env;
  auto pad = [&](const std::vector<float>& packed, float fill) {
    std::vector<float> v(std::size_t(N) * ld, fill);
    for (int n = 0; n < N; ++n)
      std::copy_n(packed.begin() + n * V, V, v.begin() + n * ld);
    return v;
  };
  auto unpad = [&](const std::vector<float>& padded) {
    std::vector<float> v(std::size_t(N) * V);
    for (int n = 0; n < N; ++n)
      std::copy_n(padded.begin() + n * ld, V, v.begin() + n * V);
    return v;
  };
  auto padding_is = [&](const std::vector<float>& padded, float fill) {
    for (std::size_t i = 0; i < padded.size(); ++i) {
      if (int(i % ld) >= V && std::memcmp(&padded[i], &fill, 4) != 0) return false;
    }
    return true;
  };
  Buffer x = env.up(uniform(std::size_t(N) * C, 140)), w = env.up(uniform(std::size_t(V) * C, 141));
  Buffer out = env.empty(std::size_t(N) * V), out_p = env.up(pad(uniform(N * V, 142), 7.0f));
  env.dev->matmul_forward(out.data(), x.data(), w.data(), nullptr, {N, C, V}, env.s());
  env.dev->matmul_forward(out_p.data(), x.data(), w.data(), nullptr, {N, C, V, ld}, env.s());
  EXPECT_TRUE(same_bits(unpad(env.down(out_p)), env.down(out)));
  EXPECT_TRUE(padding_is(env.down(out_p), 7.0f)) << "matmul_forward wrote past OC";

  const std::vector<float> dout = uniform(std::size_t(N) * V, 143);
  Buffer d = env.up(dout), d_p = env.up(pad(dout, nan));
  Buffer dx = env.empty(std::size_t(N) * C), dw = env.up(std::vector<float>(V * C, 0.0f)),
         db = env.up(std::vector<float>(V, 0.0f));
  Buffer dx_p = env.empty(std::size_t(N) * C), dw_p = env.up(std::vector<float>(V * C, 0.0f)),
         db_p = env.up(std::vector<float>(V, 0.0f));
  env.dev->matmul_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(), {N, C, V},
                           env.s());
  env.dev->matmul_backward(dx_p.data(), dw_p.data(), db_p.data(), d_p.data(), x.data(), w.data(),
                           {N, C, V, ld}, env.s());
  EXPECT_TRUE(same_bits(env.down(dx_p), env.down(dx)));
  EXPECT_TRUE(same_bits(env.down(dw_p), env.down(dw)));
  EXPECT_TRUE(same_bits(env.down(db_p), env.down(db)));

  const std::vector<std::int32_t> tgt = random_ids(N, V, 144);
  Buffer t = env.up(tgt), losses = env.empty(N), losses_p = env.empty(N);
  Buffer dl = env.empty(std::size_t(N) * V), dl_p = env.up(std::vector<float>(N * ld, 5.0f));
  env.dev->cross_entropy(losses.as<float>(), dl.data(), d.data(), t.as<std::int32_t>(), N, V, V,
                         0.5f, env.s());
  env.dev->cross_entropy(losses_p.as<float>(), dl_p.data(), d_p.data(), t.as<std::int32_t>(), N, V,
                         ld, 0.5f, env.s());
  EXPECT_TRUE(same_bits(env.down(losses_p), env.down(losses)));
  EXPECT_TRUE(same_bits(unpad(env.down(dl_p)), env.down(dl)));
  EXPECT_TRUE(padding_is(env.down(dl_p), 5.0f)) << "cross_entropy wrote past V";
}

}  // namespace
