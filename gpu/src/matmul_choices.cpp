// The timed GEMM algorithm choices as text, so that a resumed run makes the uninterrupted run's
// choices (gpu/ops.h): timing is noisy, and two processes that pick different algorithms for a
// GEMM differ in the last bits. cuBLASLt documents cublasLtMatmulAlgo_t as trivially
// serialisable for reuse with the same library version; the header names that version and the
// GPU, and a recorded algorithm is only used where the heuristic offers it again (make_plan).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cublaslt_api.h"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"
#include "matmul_plan.h"

namespace zo::gpu {
namespace {

constexpr const char* kMagic = "offload_train matmul choices 1";

// "offload_train matmul choices 1; cublasLt 130000; NVIDIA H100 80GB HBM3; sm_90"
std::string header(const MatmulContext& ctx) {
  cudaDeviceProp prop{};
  ZO_CUDA_CHECK(cudaGetDeviceProperties(&prop, ctx.device));
  return std::string(kMagic) + "; cublasLt " + std::to_string(cublaslt().cublasLtGetVersion()) +
         "; " + prop.name + "; sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
}

std::string hex(const cublasLtMatmulAlgo_t& algo) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&algo);
  std::string out;
  char buf[3];
  for (std::size_t i = 0; i < sizeof algo; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", bytes[i]);
    out += buf;
  }
  return out;
}

bool unhex(const std::string& text, cublasLtMatmulAlgo_t& algo) {
  if (text.size() != 2 * sizeof algo) return false;
  auto* bytes = reinterpret_cast<unsigned char*>(&algo);
  for (std::size_t i = 0; i < sizeof algo; ++i) {
    unsigned v = 0;
    if (std::sscanf(text.c_str() + 2 * i, "%2x", &v) != 1) return false;
    bytes[i] = static_cast<unsigned char>(v);
  }
  return true;
}

[[noreturn]] void malformed(int line, const std::string& what) {
  throw std::invalid_argument("matmul choices, line " + std::to_string(line) + ": " + what +
                              " (not written by this version of offload_train; without them "
                              "the GEMMs are timed again)");
}

}  // namespace

std::string export_matmul_choices(const MatmulContext* ctx) {
  if (ctx == nullptr) return {};
  const std::lock_guard<std::mutex> lock(ctx->mu);
  std::ostringstream out;
  std::size_t records = 0;
  for (const auto& [k, plan] : ctx->plans) {
    if (!plan->found || !(plan->timed || plan->restored)) continue;
    out << int(k.op) << ' ' << int(k.epilogue) << ' ' << int(k.t) << ' ' << k.N << ' ' << k.C << ' '
        << k.OC << ' ' << k.ld << ' ' << k.align_a << ' ' << k.align_b << ' ' << k.align_d << ' '
        << k.align_bias << ' ' << k.align_aux << ' ' << hex(plan->algo) << '\n';
    ++records;
  }
  return records == 0 ? std::string() : header(*ctx) + '\n' + out.str();
}

std::string import_matmul_choices(MatmulContext* ctx, const std::string& text) {
  if (ctx == nullptr) throw std::invalid_argument("import_matmul_choices: the context is null");
  std::istringstream in(text);
  std::string first;
  std::getline(in, first);
  if (first.rfind(kMagic, 0) != 0) malformed(1, "the header is not '" + std::string(kMagic) + "'");
  const std::string here = header(*ctx);
  if (first != here) {
    return "recorded as '" + first + "', this process is '" + here + "'";
  }
  std::map<PlanKey, cublasLtMatmulAlgo_t> restored;
  std::string line;
  for (int n = 2; std::getline(in, line); ++n) {
    std::istringstream fields(line);
    int op = 0, epilogue = 0, t = 0;
    unsigned a = 0, b = 0, d = 0, bias = 0, aux = 0;
    PlanKey k{};
    std::string algo_hex, rest;
    if (!(fields >> op >> epilogue >> t >> k.N >> k.C >> k.OC >> k.ld >> a >> b >> d >> bias >>
          aux >> algo_hex) ||
        (fields >> rest)) {
      malformed(n, "expected 12 numbers and an algorithm");
    }
    if (op < 0 || op > int(Gemm::kBackwardWeight) || epilogue < 0 ||
        epilogue > int(Epilogue::kBgradB) || !detail::valid_dtype(static_cast<DType>(t))) {
      malformed(n, "unknown GEMM, epilogue or dtype");
    }
    for (const unsigned v : {a, b, d, bias, aux}) {
      if (v > 256 || (v & (v - 1)) != 0) malformed(n, "an alignment is not a power of two <= 256");
    }
    k.op = static_cast<Gemm>(op);
    k.epilogue = static_cast<Epilogue>(epilogue);
    k.t = static_cast<DType>(t);
    k.align_a = std::uint16_t(a), k.align_b = std::uint16_t(b), k.align_d = std::uint16_t(d);
    k.align_bias = std::uint16_t(bias), k.align_aux = std::uint16_t(aux);
    if (!unhex(algo_hex, restored[k])) malformed(n, "the algorithm is not 128 hex digits");
  }
  const std::lock_guard<std::mutex> lock(ctx->mu);
  ctx->restored = std::move(restored);
  return {};
}

std::size_t matmul_restored_plan_count(const MatmulContext* ctx) {
  if (ctx == nullptr) return 0;
  const std::lock_guard<std::mutex> lock(ctx->mu);
  std::size_t n = 0;
  for (const auto& entry : ctx->plans)
    n += entry.second->restored ? 1 : 0;
  return n;
}

}  // namespace zo::gpu
