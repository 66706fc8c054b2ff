// fp32 reference implementations of the GPT ops (formulas as in GPT-2 / llm.c). GEMMs go
// through Eigen on row-major maps, one single-threaded Eigen call per fixed block; everything
// else is plain loops. Row statistics and reductions accumulate in double, so this backend is
// a tight reference for the CUDA one.
#include "device/host_ops.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace zo::dev::host {
namespace {

using Idx = Eigen::Index;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using MatMap = Eigen::Map<RowMat, Eigen::Unaligned, Stride>;
using ConstMatMap = Eigen::Map<const RowMat, Eigen::Unaligned, Stride>;

// Block sizes depend on the shapes only; see the determinism note in host_ops.h.
constexpr std::size_t kGemmRows = 64;        // rows of one GEMM block
constexpr std::size_t kQueryRows = 64;       // attention query rows per block
constexpr std::size_t kChannels = 64;        // channels per block for reductions over rows
constexpr std::size_t kElements = 1u << 14;  // elements per block for elementwise ops and sums

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

struct Range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
Range block_range(std::size_t blk, std::size_t block_size, std::size_t total) {
  const std::size_t begin = blk * block_size;
  return {begin, std::min(total, begin + block_size)};
}
// Rows per block so that a block holds about kElements values of a row length `cols`.
std::size_t rows_per_block(std::size_t cols) {
  return std::max<std::size_t>(1, kElements / cols);
}

Idx ix(std::size_t v) {
  return static_cast<Idx>(v);
}
ConstMatMap cmap(const float* p, std::size_t rows, std::size_t cols, std::size_t ld) {
  return ConstMatMap(p, ix(rows), ix(cols), Stride(ix(ld)));
}
MatMap map(float* p, std::size_t rows, std::size_t cols, std::size_t ld) {
  return MatMap(p, ix(rows), ix(cols), Stride(ix(ld)));
}

// Runs fn(block) for block in [0, nblocks) on the arena. Which thread runs a block never
// changes what it computes, so the partition is free to follow the scheduler.
template <class Fn>
void for_blocks(Arena& arena, std::size_t nblocks, const Fn& fn) {
  if (nblocks == 0) return;
  if (nblocks == 1 || arena.max_concurrency() == 1) {
    for (std::size_t b = 0; b < nblocks; ++b)
      fn(b);
    return;
  }
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, nblocks, 1),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t b = r.begin(); b != r.end(); ++b)
                          fn(b);
                      });
  });
}

[[noreturn]] void bad_id(const char* op, const char* kind, std::size_t row, std::int32_t id,
                         int limit) {
  std::string m = std::string(op) + ": " + kind + " id " + std::to_string(id) + " at row " +
                  std::to_string(row) + " is outside [0, ";
  m += limit > 0 ? std::to_string(limit) + ")" : "vocabulary size)";
  throw std::out_of_range(m + "; check that the data was tokenized for this model's vocabulary");
}

}  // namespace

// ---- embedding -------------------------------------------------------------------------------

void embedding_forward(Arena& arena, float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C) {
  const std::size_t N = std::size_t(B) * T, c = C;
  const std::size_t rows = rows_per_block(c);
  for_blocks(arena, ceil_div(N, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, N);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const std::int32_t tok = tokens[n];
      if (tok < 0) bad_id("embedding_forward", "token", n, tok, 0);
      const float* w = wte + std::size_t(tok) * c;  // (C)
      const float* p = wpe + (n % T) * c;           // (C)
      float* o = out + n * c;                       // (C)
      for (std::size_t i = 0; i < c; ++i)
        o[i] = w[i] + p[i];
    }
  });
}

void embedding_backward(Arena& arena, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, int B, int T, int C) {
  const std::size_t N = std::size_t(B) * T, c = C;
  for (std::size_t n = 0; n < N; ++n) {  // before any write, so bad ids leave dwte untouched
    if (tokens[n] < 0) bad_id("embedding_backward", "token", n, tokens[n], 0);
  }
  // Split over channels, not tokens: a repeated token's rows are then summed by one block in
  // token order, with no atomics and the same result for any thread count.
  for_blocks(arena, ceil_div(c, kChannels), [&](std::size_t blk) {
    const Range ch = block_range(blk, kChannels, c);
    for (std::size_t n = 0; n < N; ++n) {
      const float* d = dout + n * c;
      float* dw = dwte + std::size_t(tokens[n]) * c;
      float* dp = dwpe + (n % T) * c;
      for (std::size_t i = ch.begin; i < ch.end; ++i) {
        dw[i] += d[i];
        dp[i] += d[i];
      }
    }
  });
}

// ---- layernorm (arXiv 1607.06450; biased variance, eps inside the sqrt, as GPT-2) -------------

void layernorm_forward(Arena& arena, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  const std::size_t n_rows = std::size_t(N), c = C;
  const std::size_t rows = rows_per_block(c);
  for_blocks(arena, ceil_div(n_rows, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, n_rows);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const float* x = inp + n * c;  // (C)
      double sum = 0.0;
      for (std::size_t i = 0; i < c; ++i)
        sum += x[i];
      const double m = sum / double(c);
      double var = 0.0;
      for (std::size_t i = 0; i < c; ++i)
        var += (x[i] - m) * (x[i] - m);
      var /= double(c);
      // The stored fp32 mean/rstd are what the output uses, so backward recomputes it exactly.
      const float mf = static_cast<float>(m);
      const float rf = static_cast<float>(1.0 / std::sqrt(var + double{kLayerNormEps}));
      float* o = out + n * c;
      for (std::size_t i = 0; i < c; ++i)
        o[i] = (x[i] - mf) * rf * weight[i] + bias[i];
      mean[n] = mf;
      rstd[n] = rf;
    }
  });
}

void layernorm_backward(Arena& arena, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  const std::size_t n_rows = std::size_t(N), c = C;
  // dinp = rstd * (g - mean(g) - norm * mean(g * norm)), g = weight * dout: rows are independent.
  const std::size_t rows = rows_per_block(c);
  for_blocks(arena, ceil_div(n_rows, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, n_rows);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const float* x = inp + n * c;
      const float* dy = dout + n * c;
      const float m = mean[n], rs = rstd[n];
      double g_sum = 0.0, g_norm_sum = 0.0;
      for (std::size_t i = 0; i < c; ++i) {
        const float g = weight[i] * dy[i];
        g_sum += g;
        g_norm_sum += double(g) * ((x[i] - m) * rs);
      }
      const float g_mean = static_cast<float>(g_sum / double(c));
      const float g_norm_mean = static_cast<float>(g_norm_sum / double(c));
      float* dx = dinp + n * c;
      for (std::size_t i = 0; i < c; ++i) {
        const float norm = (x[i] - m) * rs;
        dx[i] += (weight[i] * dy[i] - g_mean - norm * g_norm_mean) * rs;
      }
    }
  });
  // dweight, dbias: sums over rows, split over channels so each sum runs in row order.
  for_blocks(arena, ceil_div(c, kChannels), [&](std::size_t blk) {
    const Range ch = block_range(blk, kChannels, c);
    double acc_w[kChannels] = {}, acc_b[kChannels] = {};
    for (std::size_t n = 0; n < n_rows; ++n) {
      const float* x = inp + n * c;
      const float* dy = dout + n * c;
      const float m = mean[n], rs = rstd[n];
      for (std::size_t i = ch.begin; i < ch.end; ++i) {
        acc_w[i - ch.begin] += double((x[i] - m) * rs) * dy[i];
        acc_b[i - ch.begin] += dy[i];
      }
    }
    for (std::size_t i = ch.begin; i < ch.end; ++i) {
      dweight[i] = static_cast<float>(dweight[i] + acc_w[i - ch.begin]);
      dbias[i] = static_cast<float>(dbias[i] + acc_b[i - ch.begin]);
    }
  });
}

// ---- matmul: out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias ----------------------------------

void matmul_forward(Arena& arena, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  const std::size_t n_rows = std::size_t(N), c = C, oc = OC;
  const ConstMatMap w = cmap(weight, oc, c, c);  // (OC, C)
  for_blocks(arena, ceil_div(n_rows, kGemmRows), [&](std::size_t blk) {
    const Range r = block_range(blk, kGemmRows, n_rows);
    MatMap y = map(out + r.begin * oc, r.size(), oc, oc);                   // (rows, OC)
    y.noalias() = cmap(inp + r.begin * c, r.size(), c, c) * w.transpose();  // (rows, C) @ (C, OC)
    if (bias != nullptr) y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias, ix(oc));
  });
}

void matmul_backward(Arena& arena, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  const std::size_t n_rows = std::size_t(N), c = C, oc = OC;
  const ConstMatMap w = cmap(weight, oc, c, c);  // (OC, C)
  // dinp (N,C) += dout (N,OC) @ weight (OC,C): independent row blocks.
  for_blocks(arena, ceil_div(n_rows, kGemmRows), [&](std::size_t blk) {
    const Range r = block_range(blk, kGemmRows, n_rows);
    map(dinp + r.begin * c, r.size(), c, c).noalias() +=
        cmap(dout + r.begin * oc, r.size(), oc, oc) * w;
  });
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C) and dbias (OC) += colsum(dout): the sums over N
  // stay inside one block per range of output channels.
  const ConstMatMap x = cmap(inp, n_rows, c, c);  // (N, C)
  for_blocks(arena, ceil_div(oc, kGemmRows), [&](std::size_t blk) {
    const Range o = block_range(blk, kGemmRows, oc);
    const ConstMatMap dy = cmap(dout + o.begin, n_rows, o.size(), oc);  // (N, rows of dW)
    map(dweight + o.begin * c, o.size(), c, c).noalias() += dy.transpose() * x;
    if (dbias == nullptr) return;
    double acc[kGemmRows] = {};
    for (std::size_t n = 0; n < n_rows; ++n) {
      const float* row = dout + n * oc;
      for (std::size_t j = o.begin; j < o.end; ++j)
        acc[j - o.begin] += row[j];
    }
    for (std::size_t j = o.begin; j < o.end; ++j) {
      dbias[j] = static_cast<float>(dbias[j] + acc[j - o.begin]);
    }
  });
}

// ---- elementwise -------------------------------------------------------------------------------

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

template <class Fn>
void for_elements(Arena& arena, std::size_t n, const Fn& fn) {
  for_blocks(arena, ceil_div(n, kElements), [&](std::size_t blk) {
    const Range r = block_range(blk, kElements, n);
    for (std::size_t i = r.begin; i < r.end; ++i)
      fn(i);
  });
}
}  // namespace

// GELU, tanh approximation (arXiv 1606.08415): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(Arena& arena, float* out, const float* inp, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCube * x * x * x)));
  });
}

void gelu_backward(Arena& arena, float* dinp, const float* inp, const float* dout, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float th = std::tanh(u);
    const float ch = std::cosh(u);  // sech^2 = 1 / cosh^2 keeps precision where tanh -> +-1
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f / (ch * ch)) * kGeluScale *
                                                (1.0f + 3.0f * kGeluCube * x * x);
    dinp[i] += grad * dout[i];
  });
}

void residual_forward(Arena& arena, float* out, const float* a, const float* b, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) { out[i] = a[i] + b[i]; });
}

void accumulate(Arena& arena, float* dst, const float* src, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) { dst[i] += src[i]; });
}

// ---- causal attention ---------------------------------------------------------------------------
// Per (batch, head): S = Q K^T / sqrt(hs) masked to j <= i, P = softmax(S), out = P V. Only the
// per-row log-sum-exp is kept; backward recomputes P from it (FlashAttention-2, arXiv 2307.08691).

void attention_forward(Arena& arena, float* out, float* lse, const float* qkv, int B, int T, int C,
                       int NH) {
  const std::size_t t_len = T, c = C, c3 = 3 * c, nh = NH, hs = c / nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t q_blocks = ceil_div(t_len, kQueryRows);
  for_blocks(arena, std::size_t(B) * nh * q_blocks, [&](std::size_t task) {
    const std::size_t bh = task / q_blocks, b = bh / nh, h = bh % nh;
    const Range q = block_range(task % q_blocks, kQueryRows, t_len);
    const std::size_t keys = q.end;  // causal: rows of this block see keys [0, q.end)
    const float* base = qkv + b * t_len * c3 + h * hs;
    const ConstMatMap qm = cmap(base + q.begin * c3, q.size(), hs, c3);  // (rows, hs)
    const ConstMatMap km = cmap(base + c, keys, hs, c3);                 // (keys, hs)
    const ConstMatMap vm = cmap(base + 2 * c, keys, hs, c3);             // (keys, hs)
    RowMat p(ix(q.size()), ix(keys));                                    // (rows, keys)
    p.noalias() = qm * km.transpose();
    for (std::size_t r = 0; r < q.size(); ++r) {
      const std::size_t i = q.begin + r;
      float* row = p.data() + r * keys;
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j <= i; ++j) {
        row[j] *= scale;
        m = std::max(m, row[j]);
      }
      double sum = 0.0;
      for (std::size_t j = 0; j <= i; ++j)
        sum += std::exp(row[j] - m);
      const float row_lse = static_cast<float>(double{m} + std::log(sum));
      lse[bh * t_len + i] = row_lse;  // (B, NH, T)
      for (std::size_t j = 0; j <= i; ++j)
        row[j] = std::exp(row[j] - row_lse);
      for (std::size_t j = i + 1; j < keys; ++j)
        row[j] = 0.0f;
    }
    map(out + (b * t_len + q.begin) * c + h * hs, q.size(), hs, c).noalias() = p * vm;
  });
}

void attention_backward(Arena& arena, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int C, int NH) {
  const std::size_t t_len = T, c = C, c3 = 3 * c, nh = NH, hs = c / nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // One block per (batch, head): dk and dv sum over query rows, so the query blocks of a head
  // run in order inside it and add into per-head accumulators.
  for_blocks(arena, std::size_t(B) * nh, [&](std::size_t bh) {
    const std::size_t b = bh / nh, h = bh % nh;
    const float* base = qkv + b * t_len * c3 + h * hs;
    float* dbase = dqkv + b * t_len * c3 + h * hs;
    RowMat dk = RowMat::Zero(ix(t_len), ix(hs));  // (T, hs)
    RowMat dv = RowMat::Zero(ix(t_len), ix(hs));  // (T, hs)
    RowMat p, ds;
    for (std::size_t qb = 0; qb < ceil_div(t_len, kQueryRows); ++qb) {
      const Range q = block_range(qb, kQueryRows, t_len);
      const std::size_t keys = q.end;
      const ConstMatMap qm = cmap(base + q.begin * c3, q.size(), hs, c3);  // (rows, hs)
      const ConstMatMap km = cmap(base + c, keys, hs, c3);                 // (keys, hs)
      const ConstMatMap vm = cmap(base + 2 * c, keys, hs, c3);             // (keys, hs)
      const std::size_t row0 = (b * t_len + q.begin) * c + h * hs;
      const ConstMatMap dom = cmap(dout + row0, q.size(), hs, c);  // (rows, hs)
      const ConstMatMap om = cmap(out + row0, q.size(), hs, c);    // (rows, hs)
      p.resize(ix(q.size()), ix(keys));
      p.noalias() = qm * km.transpose();
      ds.resize(ix(q.size()), ix(keys));
      ds.noalias() = dom * vm.transpose();  // dP = dout V^T
      for (std::size_t r = 0; r < q.size(); ++r) {
        const std::size_t i = q.begin + r;
        const float row_lse = lse[bh * t_len + i];
        double d = 0.0;  // D_i = dout_i . out_i = sum_j P_ij dP_ij
        for (std::size_t e = 0; e < hs; ++e)
          d += double{dom(ix(r), ix(e))} * om(ix(r), ix(e));
        const float df = static_cast<float>(d);
        float* prow = p.data() + r * keys;
        float* srow = ds.data() + r * keys;
        for (std::size_t j = 0; j <= i; ++j) {
          prow[j] = std::exp(prow[j] * scale - row_lse);
          srow[j] = prow[j] * (srow[j] - df);  // dS = P * (dP - D)
        }
        for (std::size_t j = i + 1; j < keys; ++j)
          prow[j] = srow[j] = 0.0f;
      }
      map(dbase + q.begin * c3, q.size(), hs, c3).noalias() += scale * (ds * km);
      dk.topRows(ix(keys)).noalias() += scale * (ds.transpose() * qm);
      dv.topRows(ix(keys)).noalias() += p.transpose() * dom;
    }
    map(dbase + c, t_len, hs, c3) += dk;
    map(dbase + 2 * c, t_len, hs, c3) += dv;
  });
}

// ---- loss and reductions ----------------------------------------------------------------------

void cross_entropy(Arena& arena, float* losses, float* dlogits, const float* logits,
                   const std::int32_t* targets, int N, int V, float dloss_scale) {
  const std::size_t n_rows = std::size_t(N), v = V;
  const std::size_t rows = rows_per_block(v);
  for_blocks(arena, ceil_div(n_rows, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, n_rows);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const std::int32_t target = targets[n];
      if (target < 0 || target >= V) bad_id("cross_entropy", "target", n, target, V);
      const float* x = logits + n * v;  // (V)
      float m = x[0];
      for (std::size_t j = 1; j < v; ++j)
        m = std::max(m, x[j]);
      double sum = 0.0;
      for (std::size_t j = 0; j < v; ++j)
        sum += std::exp(x[j] - m);
      const double row_lse = double{m} + std::log(sum);  // log-softmax_j = x_j - lse
      losses[n] = static_cast<float>(row_lse - x[target]);
      if (dlogits == nullptr) continue;
      float* d = dlogits + n * v;  // may alias x: each x[j] is read before d[j] is written
      for (std::size_t j = 0; j < v; ++j) {
        const float prob = std::exp(static_cast<float>(x[j] - row_lse));
        d[j] = dloss_scale * (prob - (j == std::size_t(target) ? 1.0f : 0.0f));
      }
    }
  });
}

void sum_squares(Arena& arena, float* out, const float* data, std::size_t n) {
  // Partial sums per fixed block, added in block order: the same bits for any thread count.
  std::vector<double> partial(ceil_div(n, kElements), 0.0);
  for_blocks(arena, partial.size(), [&](std::size_t blk) {
    const Range r = block_range(blk, kElements, n);
    double s = 0.0;
    for (std::size_t i = r.begin; i < r.end; ++i)
      s += double{data[i]} * data[i];
    partial[blk] = s;
  });
  double total = *out;
  for (double s : partial)
    total += s;
  *out = static_cast<float>(total);
}

void nonfinite_flag(Arena& arena, float* flag, const float* data, std::size_t n) {
  std::atomic<bool> found{false};
  for_blocks(arena, ceil_div(n, kElements), [&](std::size_t blk) {
    const Range r = block_range(blk, kElements, n);
    bool any = false;
    for (std::size_t i = r.begin; i < r.end; ++i)
      any |= !std::isfinite(data[i]);
    if (any) found.store(true, std::memory_order_relaxed);
  });
  if (found.load(std::memory_order_relaxed)) *flag = 1.0f;
}

// ---- cast ---------------------------------------------------------------------------------------

namespace {

template <DType T>
float load_float(const void* p, std::size_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::kF16) {
    return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
  } else {
    return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
  }
}

template <DType T>
void store_float(void* p, std::size_t i, float x) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(p)[i] = x;
  } else if constexpr (T == DType::kF16) {
    static_cast<std::uint16_t*>(p)[i] = float_to_half(x);
  } else {
    static_cast<std::uint16_t*>(p)[i] = float_to_bf16(x);
  }
}

template <DType S, DType D>
void cast_typed(Arena& arena, void* dst, const void* src, std::size_t n) {
  if constexpr (S == D) {
    const std::size_t bytes = n * dtype_size(S);
    for_blocks(arena, ceil_div(bytes, kElements * 4), [&](std::size_t blk) {
      const Range r = block_range(blk, kElements * 4, bytes);
      std::memcpy(static_cast<char*>(dst) + r.begin, static_cast<const char*>(src) + r.begin,
                  r.size());
    });
  } else {
    for_elements(arena, n, [&](std::size_t i) { store_float<D>(dst, i, load_float<S>(src, i)); });
  }
}

template <DType S>
void cast_from(Arena& arena, void* dst, DType dst_t, const void* src, std::size_t n) {
  switch (dst_t) {
    case DType::kF32:
      return cast_typed<S, DType::kF32>(arena, dst, src, n);
    case DType::kF16:
      return cast_typed<S, DType::kF16>(arena, dst, src, n);
    case DType::kBF16:
      return cast_typed<S, DType::kBF16>(arena, dst, src, n);
  }
  throw std::invalid_argument("cast: unknown destination dtype");
}

}  // namespace

void cast(Arena& arena, void* dst, DType dst_t, const void* src, DType src_t, std::size_t n) {
  switch (src_t) {
    case DType::kF32:
      return cast_from<DType::kF32>(arena, dst, dst_t, src, n);
    case DType::kF16:
      return cast_from<DType::kF16>(arena, dst, dst_t, src, n);
    case DType::kBF16:
      return cast_from<DType::kBF16>(arena, dst, dst_t, src, n);
  }
  throw std::invalid_argument("cast: unknown source dtype");
}

}  // namespace zo::dev::host
