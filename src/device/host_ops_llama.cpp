// Host ops of the Llama family: RMSNorm, rotary embeddings, SwiGLU (formulas in device.h).
#include <cmath>
#include <cstddef>

#include "device/host_ops.h"
#include "device/host_ops_internal.h"

namespace zo::dev::host {

// ---- RMSNorm (arXiv 1910.07467) -----------------------------------------------------------------

void rmsnorm_forward(Arena& arena, float* out, float* rstd, const float* inp, const float* weight,
                     int N, int C, float eps) {
  const std::size_t n_rows = std::size_t(N), c = C;
  const std::size_t rows = rows_per_block(c);
  for_blocks(arena, ceil_div(n_rows, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, n_rows);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const float* x = inp + n * c;  // (C)
      double sum_sq = 0.0;
      for (std::size_t i = 0; i < c; ++i)
        sum_sq += double{x[i]} * x[i];
      // The stored fp32 rstd is what the output uses, so the backward recomputes it exactly.
      const float rs = static_cast<float>(1.0 / std::sqrt(sum_sq / double(c) + double{eps}));
      float* o = out + n * c;
      for (std::size_t i = 0; i < c; ++i)
        o[i] = x[i] * rs * weight[i];
      rstd[n] = rs;
    }
  });
}

void rmsnorm_backward(Arena& arena, float* dinp, const float* dresidual, float* dweight,
                      const float* dout, const float* inp, const float* weight, const float* rstd,
                      int N, int C) {
  const std::size_t n_rows = std::size_t(N), c = C;
  // With norm = x * rstd and g = weight * dout: dinp = dresidual + rstd * (g - norm * mean(g *
  // norm)), rows independent. dresidual may be dinp (each element is read before it is written).
  const std::size_t rows = rows_per_block(c);
  for_blocks(arena, ceil_div(n_rows, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, n_rows);
    for (std::size_t n = r.begin; n < r.end; ++n) {
      const float* x = inp + n * c;
      const float* dy = dout + n * c;
      const float rs = rstd[n];
      double g_norm_sum = 0.0;
      for (std::size_t i = 0; i < c; ++i)
        g_norm_sum += double(weight[i] * dy[i]) * (x[i] * rs);
      const float g_norm_mean = static_cast<float>(g_norm_sum / double(c));
      float* dx = dinp + n * c;
      const float* dr = dresidual != nullptr ? dresidual + n * c : nullptr;
      for (std::size_t i = 0; i < c; ++i) {
        const float d = (weight[i] * dy[i] - x[i] * rs * g_norm_mean) * rs;
        dx[i] = dr != nullptr ? dr[i] + d : d;
      }
    }
  });
  // dweight: sums over rows, split over channels so each sum runs in row order.
  for_blocks(arena, ceil_div(c, kChannels), [&](std::size_t blk) {
    const Range ch = block_range(blk, kChannels, c);
    double acc[kChannels] = {};
    for (std::size_t n = 0; n < n_rows; ++n) {
      const float* x = inp + n * c;
      const float* dy = dout + n * c;
      for (std::size_t i = ch.begin; i < ch.end; ++i)
        acc[i - ch.begin] += double(x[i] * rstd[n]) * dy[i];
    }
    for (std::size_t i = ch.begin; i < ch.end; ++i)
      dweight[i] = static_cast<float>(dweight[i] + acc[i - ch.begin]);
  });
}

// ---- rotary embeddings (arXiv 2104.09864; Hugging Face's rotate_half pairs (i, i + hs/2)) -------

void rope(Arena& arena, float* qkv, const float* inv_freq, int B, int T, int NH, int NKV, int hs,
          int pos0, bool inverse) {
  const std::size_t tokens = std::size_t(B) * T, half = std::size_t(hs) / 2;
  const std::size_t heads = std::size_t(NH) + NKV;  // q then k heads: adjacent in each row
  const std::size_t ld = (std::size_t(NH) + 2 * std::size_t(NKV)) * hs;
  const float sign = inverse ? -1.0f : 1.0f;  // the transpose rotates by -angle
  const std::size_t rows = rows_per_block(heads * hs);
  for_blocks(arena, ceil_div(tokens, rows), [&](std::size_t blk) {
    const Range r = block_range(blk, rows, tokens);
    for (std::size_t tok = r.begin; tok < r.end; ++tok) {
      const float t = static_cast<float>(std::size_t(pos0) + tok % std::size_t(T));  // position
      for (std::size_t i = 0; i < half; ++i) {
        const float angle = t * inv_freq[i];  // fp32, as Hugging Face
        const float cs = std::cos(angle), sn = sign * std::sin(angle);
        for (std::size_t h = 0; h < heads; ++h) {
          float* x = qkv + tok * ld + h * std::size_t(hs);
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cs - x2 * sn;
          x[i + half] = x2 * cs + x1 * sn;
        }
      }
    }
  });
}

// ---- SwiGLU (arXiv 2002.05202) ------------------------------------------------------------------

namespace {
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
}  // namespace

void swiglu_forward(Arena& arena, float* out, const float* gate_up, int N, int I) {
  const std::size_t i_size = I;
  for_elements(arena, std::size_t(N) * i_size, [&](std::size_t e) {
    const std::size_t n = e / i_size, j = e % i_size;
    const float gate = gate_up[2 * i_size * n + j], up = gate_up[2 * i_size * n + i_size + j];
    out[e] = gate * sigmoid(gate) * up;
  });
}

void swiglu_backward(Arena& arena, float* dgate_up, const float* dout, const float* gate_up, int N,
                     int I) {
  const std::size_t i_size = I;
  // Element (n, j) reads gate and up at (n, j), (n, I + j) and writes only those two: dgate_up
  // may alias gate_up.
  for_elements(arena, std::size_t(N) * i_size, [&](std::size_t e) {
    const std::size_t n = e / i_size, j = e % i_size;
    const std::size_t gi = 2 * i_size * n + j, ui = gi + i_size;
    const float gate = gate_up[gi], up = gate_up[ui], s = sigmoid(gate), d = dout[e];
    dgate_up[gi] = d * up * (s * (1.0f + gate * (1.0f - s)));  // silu' = s (1 + x (1 - s))
    dgate_up[ui] = d * gate * s;
  });
}

}  // namespace zo::dev::host
