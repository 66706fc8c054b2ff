// Host ops: token + position embedding and layernorm, forward and backward.
#include "device/host_ops.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "device/host_ops_internal.h"

namespace zo::dev::host {

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
      float* o = out + n * c;                       // (C)
      if (wpe == nullptr) {                         // no learned positions
        std::copy(w, w + c, o);
        continue;
      }
      const float* p = wpe + (n % T) * c;  // (C)
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
      for (std::size_t i = ch.begin; i < ch.end; ++i)
        dw[i] += d[i];
      if (dwpe == nullptr) continue;
      float* dp = dwpe + (n % T) * c;
      for (std::size_t i = ch.begin; i < ch.end; ++i)
        dp[i] += d[i];
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

void layernorm_backward(Arena& arena, float* dinp, const float* dresidual, float* dweight,
                        float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, int N, int C) {
  const std::size_t n_rows = std::size_t(N), c = C;
  // dinp = dresidual + rstd * (g - mean(g) - norm * mean(g * norm)), g = weight * dout: rows are
  // independent. dresidual may be dinp (each element is read before it is written).
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
      const float* dr = dresidual != nullptr ? dresidual + n * c : nullptr;
      for (std::size_t i = 0; i < c; ++i) {
        const float norm = (x[i] - m) * rs;
        const float d = (weight[i] * dy[i] - g_mean - norm * g_norm_mean) * rs;
        dx[i] = dr != nullptr ? dr[i] + d : d;
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

}  // namespace zo::dev::host
