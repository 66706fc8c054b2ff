// Host ops: causal self-attention, forward and backward.
#include "device/host_ops.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "device/host_ops_internal.h"

namespace zo::dev::host {

// ---- causal attention ---------------------------------------------------------------------------
// Per (batch, head): S = Q K^T / sqrt(hs) masked to j <= i, P = softmax(S), out = P V. Only the
// per-row log-sum-exp is kept; backward recomputes P from it (FlashAttention-2, arXiv 2307.08691).

void attention_forward(Arena& arena, float* out, float* lse, const float* qkv, int B, int T, int NH,
                       int NKV, int hs_in) {
  const std::size_t t_len = T, nh = NH, hs = hs_in, group = std::size_t(NH / NKV);
  const std::size_t ld = (nh + 2 * std::size_t(NKV)) * hs, c = nh * hs;  // qkv's, out's rows
  const std::size_t k_col = c, v_col = c + std::size_t(NKV) * hs;        // k and v parts of qkv
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const std::size_t q_blocks = ceil_div(t_len, kQueryRows);
  for_blocks(arena, std::size_t(B) * nh * q_blocks, [&](std::size_t task) {
    const std::size_t bh = task / q_blocks, b = bh / nh, h = bh % nh;
    const Range q = block_range(task % q_blocks, kQueryRows, t_len);
    const std::size_t keys = q.end;  // causal: rows of this block see keys [0, q.end)
    const float* seq = qkv + b * t_len * ld;
    const std::size_t kv = (h / group) * hs;  // kv head h / group
    const ConstMatMap qm = cmap(seq + q.begin * ld + h * hs, q.size(), hs, ld);  // (rows, hs)
    const ConstMatMap km = cmap(seq + k_col + kv, keys, hs, ld);                 // (keys, hs)
    const ConstMatMap vm = cmap(seq + v_col + kv, keys, hs, ld);                 // (keys, hs)
    RowMat p(ix(q.size()), ix(keys));                                            // (rows, keys)
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

// The last row of attention_forward's causal softmax, for one query row per (batch, head): the
// scores of keys [0, pos] scaled, their log-sum-exp in double as there, then the weighted values.
void attention_decode(Arena& arena, float* out, const float* qkv, int B, int T, int NH, int NKV,
                      int hs_in, int pos) {
  const std::size_t nh = NH, hs = hs_in, group = std::size_t(NH / NKV), keys = std::size_t(pos) + 1;
  const std::size_t ld = (nh + 2 * std::size_t(NKV)) * hs, c = nh * hs;  // qkv's, out's rows
  const std::size_t k_col = c, v_col = c + std::size_t(NKV) * hs;        // k and v parts of qkv
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for_blocks(arena, std::size_t(B) * nh, [&](std::size_t bh) {
    const std::size_t b = bh / nh, h = bh % nh, kv = (h / group) * hs;
    const float* seq = qkv + b * std::size_t(T) * ld;
    const ConstMatMap qm = cmap(seq + keys * ld - ld + h * hs, 1, hs, ld);  // (1, hs)
    const ConstMatMap km = cmap(seq + k_col + kv, keys, hs, ld);            // (keys, hs)
    const ConstMatMap vm = cmap(seq + v_col + kv, keys, hs, ld);            // (keys, hs)
    RowMat p(1, ix(keys));                                                  // (1, keys)
    p.noalias() = qm * km.transpose();
    float* row = p.data();
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < keys; ++j) {
      row[j] *= scale;
      m = std::max(m, row[j]);
    }
    double sum = 0.0;
    for (std::size_t j = 0; j < keys; ++j)
      sum += std::exp(row[j] - m);
    const float row_lse = static_cast<float>(double{m} + std::log(sum));
    for (std::size_t j = 0; j < keys; ++j)
      row[j] = std::exp(row[j] - row_lse);
    map(out + bh * hs, 1, hs, c).noalias() = p * vm;
  });
}

void attention_backward(Arena& arena, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int NH, int NKV,
                        int hs_in) {
  const std::size_t t_len = T, nh = NH, nkv = NKV, hs = hs_in, group = nh / nkv;
  const std::size_t ld = (nh + 2 * nkv) * hs, c = nh * hs;  // qkv's, out's rows
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // One block per (batch, kv head): dk and dv sum over the query rows of the group's query heads,
  // so those heads and their query blocks run in order inside it and add into per-kv-head
  // accumulators.
  for_blocks(arena, std::size_t(B) * nkv, [&](std::size_t bg) {
    const std::size_t b = bg / nkv, g = bg % nkv;
    const float* seq = qkv + b * t_len * ld;
    float* dseq = dqkv + b * t_len * ld;
    const std::size_t k_col = c + g * hs, v_col = c + (nkv + g) * hs;
    RowMat dk = RowMat::Zero(ix(t_len), ix(hs));  // (T, hs)
    RowMat dv = RowMat::Zero(ix(t_len), ix(hs));  // (T, hs)
    RowMat p, ds;
    for (std::size_t task = 0; task < group * ceil_div(t_len, kQueryRows); ++task) {
      const std::size_t h = g * group + task / ceil_div(t_len, kQueryRows);
      const std::size_t bh = b * nh + h;
      const Range q = block_range(task % ceil_div(t_len, kQueryRows), kQueryRows, t_len);
      const std::size_t keys = q.end;
      const ConstMatMap qm = cmap(seq + q.begin * ld + h * hs, q.size(), hs, ld);  // (rows, hs)
      const ConstMatMap km = cmap(seq + k_col, keys, hs, ld);                      // (keys, hs)
      const ConstMatMap vm = cmap(seq + v_col, keys, hs, ld);                      // (keys, hs)
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
      map(dseq + q.begin * ld + h * hs, q.size(), hs, ld).noalias() = scale * (ds * km);
      dk.topRows(ix(keys)).noalias() += scale * (ds.transpose() * qm);
      dv.topRows(ix(keys)).noalias() += p.transpose() * dom;
    }
    map(dseq + k_col, t_len, hs, ld) = dk;
    map(dseq + v_col, t_len, hs, ld) = dv;
  });
}

}  // namespace zo::dev::host
