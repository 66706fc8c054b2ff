// Host ops: matmul with bias (Eigen GEMMs) and the elementwise ops: GELU, residual add,
// accumulate.
#include "device/host_ops.h"

#include <Eigen/Core>
#include <cmath>
#include <cstddef>

#include "device/host_ops_internal.h"

namespace zo::dev::host {

// ---- matmul: out (N,OC; row stride ld) = inp (N,C) @ weight (OC,C)^T + bias --------------------

void matmul_forward(Arena& arena, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC, int ld) {
  const std::size_t n_rows = std::size_t(N), c = C, oc = OC, lo = ld;
  const ConstMatMap w = cmap(weight, oc, c, c);  // (OC, C)
  for_blocks(arena, ceil_div(n_rows, kGemmRows), [&](std::size_t blk) {
    const Range r = block_range(blk, kGemmRows, n_rows);
    MatMap y = map(out + r.begin * lo, r.size(), oc, lo);                   // (rows, OC)
    y.noalias() = cmap(inp + r.begin * c, r.size(), c, c) * w.transpose();  // (rows, C) @ (C, OC)
    if (bias != nullptr) y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias, ix(oc));
  });
}

void matmul_backward(Arena& arena, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC, int ld) {
  const std::size_t n_rows = std::size_t(N), c = C, oc = OC, lo = ld;
  const ConstMatMap w = cmap(weight, oc, c, c);  // (OC, C)
  // dinp (N,C) = dout (N,OC) @ weight (OC,C): independent row blocks. Eigen's `=` zeroes and
  // accumulates, so this equals `+=` into a zeroed dinp bit for bit.
  for_blocks(arena, ceil_div(n_rows, kGemmRows), [&](std::size_t blk) {
    const Range r = block_range(blk, kGemmRows, n_rows);
    map(dinp + r.begin * c, r.size(), c, c).noalias() =
        cmap(dout + r.begin * lo, r.size(), oc, lo) * w;
  });
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C) and dbias (OC) += colsum(dout): the sums over N
  // stay inside one block per range of output channels.
  const ConstMatMap x = cmap(inp, n_rows, c, c);  // (N, C)
  for_blocks(arena, ceil_div(oc, kGemmRows), [&](std::size_t blk) {
    const Range o = block_range(blk, kGemmRows, oc);
    const ConstMatMap dy = cmap(dout + o.begin, n_rows, o.size(), lo);  // (N, rows of dW)
    map(dweight + o.begin * c, o.size(), c, c).noalias() += dy.transpose() * x;
    if (dbias == nullptr) return;
    double acc[kGemmRows] = {};
    for (std::size_t n = 0; n < n_rows; ++n) {
      const float* row = dout + n * lo;
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

float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  const float th = std::tanh(u);
  const float ch = std::cosh(u);  // sech^2 = 1 / cosh^2 keeps precision where tanh -> +-1
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f / (ch * ch)) * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
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
  for_elements(arena, n, [&](std::size_t i) { dinp[i] += gelu_grad(inp[i]) * dout[i]; });
}

void gelu_grad_in_place(Arena& arena, float* d, const float* pre, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) { d[i] = gelu_grad(pre[i]) * d[i]; });
}

void residual_forward(Arena& arena, float* out, const float* a, const float* b, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) { out[i] = a[i] + b[i]; });
}

void accumulate(Arena& arena, float* dst, const float* src, std::size_t n) {
  for_elements(arena, n, [&](std::size_t i) { dst[i] += src[i]; });
}

}  // namespace zo::dev::host
