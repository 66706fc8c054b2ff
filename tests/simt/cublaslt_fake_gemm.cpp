// The arithmetic of the SIMT emulator's cuBLASLt (cublaslt_fake.h): D = alpha * op(A) op(B) +
// beta * C and the epilogues, in fp32 with sums over k ascending and no FMA (compiled with
// -ffp-contract=off), each output rounded once to its type, so that a result does not depend on
// the thread count. BGRADB's column sums, whose order cuBLASLt leaves open, are exact (double)
// before their one rounding. The GELU formulas are the host backend's (src/device/host_ops_*.cpp).
#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "cublaslt_fake.h"

namespace zo::simt::lt {
namespace {

float load_elem(cudaDataType_t type, const void* base, std::uint64_t i) {
  switch (type) {
    case CUDA_R_16F:
      return zo::half_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case CUDA_R_16BF:
      return zo::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

void store_elem(cudaDataType_t type, void* base, std::uint64_t i, float v) {
  switch (type) {
    case CUDA_R_16F:
      static_cast<std::uint16_t*>(base)[i] = zo::float_to_half(v);
      break;
    case CUDA_R_16BF:
      static_cast<std::uint16_t*>(base)[i] = zo::float_to_bf16(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

float gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCube * x * x * x)));
}

float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCube * x * x * x);
  const float ch = std::cosh(u);
  return 0.5f * (1.0f + std::tanh(u)) +
         0.5f * x * (1.0f / (ch * ch)) * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
}

// Output columns handled together: each keeps its own accumulator, so the width changes the speed
// (the compiler vectorises across the panel) and never a result.
constexpr std::uint64_t kPanel = 8;

// x (before the epilogue's transform) -> what D stores; writes the aux output on the way.
float epilogue(const Gemm& g, std::uint64_t i, std::uint64_t j, float acc) {
  float v = g.alpha * acc;
  // beta == 0: C is not read (it may hold NaN). In place, C is read just before D.
  if (g.beta != 0.0f) v = v + g.beta * load_elem(g.type, g.c, j * g.ldc + i);
  const Epilogue& e = g.epilogue;
  if (e.bias) v = v + load_elem(g.bias_type, g.bias, i);
  const std::uint64_t at = j * g.aux_ld + i;
  if (e.aux_out) store_elem(g.aux_type, g.aux, at, v);
  if (e.gelu) v = gelu(v);
  if (e.dgelu) v = v * gelu_grad(load_elem(g.aux_type, g.aux, at));  // read before D is written
  return v;
}

}  // namespace

bool decode_epilogue(std::uint32_t epilogue, Epilogue& out) {
  Epilogue e;
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      break;
    case CUBLASLT_EPILOGUE_BIAS:
      e.bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU:
      e.gelu = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      e.gelu = e.bias = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX:
      e.gelu = e.aux_out = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      e.gelu = e.aux_out = e.bias = true;
      break;
    case CUBLASLT_EPILOGUE_DGELU:
      e.dgelu = true;
      break;
    case CUBLASLT_EPILOGUE_BGRADB:
      e.bgradb = true;
      break;
    default:
      return false;
  }
  out = e;
  return true;
}

void run_gemm(const Gemm& g) {
  const std::uint64_t m = g.m, n = g.n, k = g.k, panels = (n + kPanel - 1) / kPanel;
  // op(A) row by row and op(B) in panels of kPanel columns (p-major inside a panel), as fp32,
  // all read before D is written, so D may even alias A or B.
  std::vector<float> a(m * k), b(panels * k * kPanel, 0.0f);
  tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, m), [&](const auto& rows) {
    for (std::uint64_t i = rows.begin(); i != rows.end(); ++i) {
      for (std::uint64_t p = 0; p < k; ++p) {
        a[i * k + p] = load_elem(g.type, g.a, g.ta ? i * g.lda + p : p * g.lda + i);
      }
    }
  });
  tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, n), [&](const auto& cols) {
    for (std::uint64_t j = cols.begin(); j != cols.end(); ++j) {
      float* panel = b.data() + (j / kPanel) * k * kPanel + j % kPanel;
      for (std::uint64_t p = 0; p < k; ++p) {
        panel[p * kPanel] = load_elem(g.type, g.b, g.tb ? p * g.ldb + j : j * g.ldb + p);
      }
      if (g.epilogue.bgradb) {  // the column sum of op(B), from the copy
        // cuBLASLt does not document the reduction's order; this one is exact, rounded once.
        double sum = 0.0;
        for (std::uint64_t p = 0; p < k; ++p)
          sum += panel[p * kPanel];
        store_elem(g.bias_type, g.bias, j, static_cast<float>(sum));
      }
    }
  });
  using Range = tbb::blocked_range2d<std::uint64_t>;
  tbb::parallel_for(Range(0, panels, 0, m), [&](const Range& r) {
    for (std::uint64_t panel = r.rows().begin(); panel != r.rows().end(); ++panel) {
      const float* bp = b.data() + panel * k * kPanel;
      for (std::uint64_t i = r.cols().begin(); i != r.cols().end(); ++i) {
        const float* ai = a.data() + i * k;
        float acc[kPanel] = {};
        for (std::uint64_t p = 0; p < k; ++p) {
          for (std::uint64_t t = 0; t < kPanel; ++t) {
            acc[t] = acc[t] + ai[p] * bp[p * kPanel + t];
          }
        }
        const std::uint64_t width = std::min(kPanel, n - panel * kPanel);
        for (std::uint64_t t = 0; t < width; ++t) {
          const std::uint64_t j = panel * kPanel + t;
          store_elem(g.type, g.d, j * g.ldd + i, epilogue(g, i, j, acc[t]));
        }
      }
    }
  });
}

}  // namespace zo::simt::lt
