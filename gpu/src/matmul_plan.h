// The cuBLASLt side of the matmul op, private to gpu/src: the context, the plans (descriptors and
// the chosen algorithm of one GEMM with one epilogue) and their cache. matmul_plan.cpp makes a
// plan once per key, timing the heuristic's candidates on the stream when it offers several;
// matmul.cpp's launchers run them. Plain C++ (no kernels).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/dtype.h"
#include "gpu/check.h"

// Every failing status becomes a CublasError naming the call, file:line, the current device and
// the status (name and description).
#define ZO_CUBLAS_CHECK(expr)                                                                    \
  do {                                                                                           \
    const cublasStatus_t zo_cublas_check_status_ = (expr);                                       \
    if (zo_cublas_check_status_ != CUBLAS_STATUS_SUCCESS) {                                      \
      ::zo::gpu::detail::throw_cublas_error(zo_cublas_check_status_, #expr, __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)

namespace zo::gpu {

namespace detail {
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line);
}  // namespace detail

// 32 MiB, as llm.c and PyTorch: cuBLASLt's workspace, except the last MiB, where the BGRADB
// epilogue writes its bias gradient for the accumulating kernel to add.
inline constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
inline constexpr std::size_t kBiasGradBytes = std::size_t{1} << 20;
inline constexpr std::size_t kGemmWorkspaceBytes = kWorkspaceBytes - kBiasGradBytes;

enum class Gemm : std::uint8_t { kForward, kBackwardInput, kBackwardWeight };
enum class Epilogue : std::uint8_t { kNone, kBias, kGeluAux, kGeluAuxBias, kDgelu, kBgradB };

// What a plan depends on. Alignments are in bytes (powers of two up to 256) and cover each
// operand's pointer and row pitch, so a plan is only reused where its kernel is valid. `ld` is the
// row stride (elements) of out (forward) or dout (backward).
struct PlanKey {
  Gemm op;
  Epilogue epilogue;
  DType t;
  int N, C, OC, ld;
  std::uint16_t align_a, align_b, align_d, align_bias, align_aux;
  auto operator<=>(const PlanKey&) const = default;
};

// The pointers of one GEMM, D = A-op-B (+ beta D): bias is read (kBias) or written (kBgradB), aux
// written (kGeluAux*) or read (kDgelu).
struct Operands {
  const void* a;
  const void* b;
  void* d;
  float beta;
  void* bias;
  void* aux;
};

// Descriptors and the chosen algorithm of one GEMM, created once per key.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // d also describes C
  std::size_t d_bytes = 0;                                       // D's extent (for timing scratch)
  cublasLtMatmulAlgo_t algo{};
  Epilogue epilogue = Epilogue::kNone;
  bool found = false;     // false: no algorithm (an epilogue then falls back)
  bool timed = false;     // chosen by timing several candidates
  bool restored = false;  // the candidate another process chose (import_matmul_choices)

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan();
};

struct MatmulContext {
  int device = -1;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;       // kWorkspaceBytes; also the bias-gradient partial sums
  cudaEvent_t last_use = nullptr;  // recorded after every launch that touched the workspace
  cudaStream_t last_stream = nullptr;
  bool used = false;
  bool autotune = true;  // time the candidates (ZO_MATMUL_AUTOTUNE=0: the heuristic's first)
  // Guards everything below and serialises launches (they share the workspace).
  mutable std::mutex mu;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  // Choices imported from another process (matmul_choices.cpp): a plan made for one of these keys
  // takes the recorded algorithm without timing when the heuristic offers it among its candidates.
  std::map<PlanKey, cublasLtMatmulAlgo_t> restored;

  MatmulContext() = default;
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;
  ~MatmulContext();

  void* bias_grad() const { return static_cast<char*>(workspace) + kGemmWorkspaceBytes; }
};

// "matmul forward with GELU N=... (operand alignments ...)" for error messages.
std::string describe(const PlanKey& k);

// The cached plan for `key`, made on first use from the operands of that call (the heuristic reads
// the bias and aux pointers' alignment; several candidates are timed on stream s, into scratch
// instead of ops.d when the call accumulates). Throws CublasError when a GEMM without epilogue
// has no algorithm; an epilogue's plan is then found = false instead.
Plan& plan_for(MatmulContext& ctx, const PlanKey& key, const Operands& ops, cudaStream_t s);

// Enqueues plan p on s with ops' pointers. Returns cuBLASLt's status instead of throwing, so that a
// refused epilogue can fall back (nothing was enqueued then).
cublasStatus_t run_plan(MatmulContext& ctx, const Plan& p, const Operands& ops, cudaStream_t s);

}  // namespace zo::gpu
