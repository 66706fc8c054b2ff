// The matmul op through cuBLASLt. Our tensors are row-major and cuBLASLt's are column-major; a
// row-major (R, K) array is the column-major (K, R) array with the same bytes, so each GEMM below
// is written for the transposes:
//   forward          out^T (OC,N)  = W (OC,C) . inp^T (C,N)       W is stored as (C,OC): op T
//   backward input   dinp^T (C,N) += W^T (C,OC) . dout^T (OC,N)
//   backward weight  dW^T (C,OC)  += inp^T (C,N) . dout (N,OC)     dout is stored as (OC,N): op T
// Accumulation (+=) is beta = 1 with C = D (cuBLASLt supports in-place C == D). Compute is fp32
// for every storage type (CUBLAS_COMPUTE_32F: true fp32 for fp32 storage, never TF32). The bias
// gradient is a deterministic column-sum kernel (matmul_bias.cu) because BGRADB overwrites.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"
#include "matmul_bias.h"

// Every failing status becomes a CublasError naming the call, file:line, the current device and
// the status (name and description).
#define ZO_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                   \
    const cublasStatus_t zo_cublas_check_status_ = (expr);                               \
    if (zo_cublas_check_status_ != CUBLAS_STATUS_SUCCESS) {                              \
      ::zo::gpu::throw_cublas_error(zo_cublas_check_status_, #expr, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)

namespace zo::gpu {
namespace {

// "CUBLAS_STATUS_NOT_SUPPORTED (the requested functionality is not supported)".
std::string cublas_status_text(cublasStatus_t status) {
  std::string text = cublasLtGetStatusName(status);
  text += " (";
  text += cublasLtGetStatusString(status);
  text += ')';
  return text;
}

const char* cublas_hint(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the GPU is out of memory; lower the micro-batch size or free memory held by other "
             "processes (nvidia-smi)";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "this GPU lacks a feature the GEMM needs; the trainer requires compute capability "
             "8.0 (Ampere) or newer";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLASLt could not initialise; check the driver and that libcublasLt matches the "
             "CUDA runtime";
    default:
      return "";
  }
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line) {
  std::ostringstream msg;
  msg << "cuBLASLt error " << cublas_status_text(status) << " from `" << expr << "` at " << file
      << ':' << line;
  int device = -1;
  if (cudaGetDevice(&device) == cudaSuccess) {
    msg << " (device " << device << ')';
  }
  (void)cudaGetLastError();  // keep a failed query out of later launch checks
  if (const char* hint = cublas_hint(status); *hint != '\0') msg << ": " << hint;
  throw CublasError(status, msg.str());
}

}  // namespace

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // 32 MiB, as llm.c and PyTorch

enum class Gemm : std::uint8_t { kForward, kForwardBias, kBackwardInput, kBackwardWeight };

const char* gemm_name(Gemm g) {
  switch (g) {
    case Gemm::kForward:
      return "forward";
    case Gemm::kForwardBias:
      return "forward with bias";
    case Gemm::kBackwardInput:
      return "backward (input gradient)";
    case Gemm::kBackwardWeight:
      return "backward (weight gradient)";
  }
  return "?";
}

// What a heuristic choice depends on. Alignments are in bytes (powers of two up to 256) and
// cover each operand's pointer and row pitch, so a plan is only reused where its kernel is valid.
struct PlanKey {
  Gemm op;
  DType t;
  int N, C, OC;
  std::uint16_t align_a, align_b, align_d, align_bias;
  auto operator<=>(const PlanKey&) const = default;
};

// Descriptors and the chosen algorithm of one GEMM, created once per key.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // d also describes C
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false only for kForwardBias, which then falls back to broadcast + GEMM

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d != nullptr) (void)cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
  }
};

class Preference {
 public:
  Preference() { ZO_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_)); }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(pref_); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;

  template <typename V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, V value) {
    ZO_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, attr, &value, sizeof value));
  }
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
  }
  throw std::invalid_argument("matmul: unknown dtype value " + std::to_string(static_cast<int>(t)) +
                              " (expected fp32, fp16 or bf16)");
}

// Largest power of two (<= 256) dividing both the address and the row pitch.
std::uint16_t alignment(const void* p, std::size_t pitch_bytes) {
  const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(p) | pitch_bytes | 256u;
  return static_cast<std::uint16_t>(bits & (~bits + 1));
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  ZO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}

std::string describe(const PlanKey& k) {
  std::ostringstream s;
  s << "matmul " << gemm_name(k.op) << " N=" << k.N << " C=" << k.C << " OC=" << k.OC
    << " dtype=" << dtype_name(k.t) << " (operand alignments " << k.align_a << '/' << k.align_b
    << '/' << k.align_d << " bytes";
  if (k.op == Gemm::kForwardBias) s << ", bias " << k.align_bias;
  s << ')';
  return s.str();
}

}  // namespace

struct MatmulContext {
  int device = -1;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;       // kWorkspaceBytes; also the bias-gradient partial sums
  cudaEvent_t last_use = nullptr;  // recorded after every launch that touched the workspace
  cudaStream_t last_stream = nullptr;
  bool used = false;
  mutable std::mutex
      mu;  // guards everything below and serialises launches (they share the workspace)
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  MatmulContext() = default;
  MatmulContext(const MatmulContext&) = delete;
  MatmulContext& operator=(const MatmulContext&) = delete;
  ~MatmulContext() {
    int previous = -1;
    const bool switched = device >= 0 && cudaGetDevice(&previous) == cudaSuccess &&
                          previous != device && cudaSetDevice(device) == cudaSuccess;
    // Work still queued may use the workspace: wait for it before freeing.
    if (last_use != nullptr && used) (void)cudaEventSynchronize(last_use);
    plans.clear();
    if (handle != nullptr) (void)cublasLtDestroy(handle);
    if (workspace != nullptr && cudaFree(workspace) != cudaSuccess) {
      std::fprintf(stderr, "warning: cudaFree of the cuBLASLt workspace failed\n");
    }
    if (last_use != nullptr) (void)cudaEventDestroy(last_use);
    if (switched) (void)cudaSetDevice(previous);
    (void)cudaGetLastError();  // nothing from teardown may surface in a later launch check
  }
};

namespace {

// One launch's hold on the context: takes the lock, makes `stream` wait for the previous user of
// the workspace when that was another stream, and on exit (also when unwinding) records that this
// stream is now the last user.
class Session {
 public:
  Session(MatmulContext& ctx, cudaStream_t stream) : ctx_(ctx), lock_(ctx.mu), stream_(stream) {
    int current = -1;
    ZO_CUDA_CHECK(cudaGetDevice(&current));
    if (current != ctx.device) {
      throw std::logic_error("matmul: the context belongs to device " + std::to_string(ctx.device) +
                             " but device " + std::to_string(current) +
                             " is current; call cudaSetDevice first");
    }
    if (ctx.used && ctx.last_stream != stream) {
      ZO_CUDA_CHECK(cudaStreamWaitEvent(stream, ctx.last_use, 0));
    }
  }
  ~Session() {
    if (cudaEventRecord(ctx_.last_use, stream_) == cudaSuccess) {
      ctx_.last_stream = stream_;
      ctx_.used = true;
    } else {
      (void)cudaGetLastError();
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  MatmulContext& ctx_;
  std::lock_guard<std::mutex> lock_;
  cudaStream_t stream_;
};

std::unique_ptr<Plan> make_plan(MatmulContext& ctx, const PlanKey& k, const void* bias) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = cuda_type(k.t);
  const auto N = static_cast<std::uint64_t>(k.N), C = static_cast<std::uint64_t>(k.C),
             OC = static_cast<std::uint64_t>(k.OC);
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  std::uint64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0, d_rows = 0, d_cols = 0;
  switch (k.op) {
    case Gemm::kForward:
    case Gemm::kForwardBias:  // D (OC,N) = op_T(W: C x OC) . inp (C x N)
      ta = CUBLAS_OP_T;
      a_rows = C, a_cols = OC, b_rows = C, b_cols = N, d_rows = OC, d_cols = N;
      break;
    case Gemm::kBackwardInput:  // D (C,N) += W (C x OC) . dout (OC x N)
      a_rows = C, a_cols = OC, b_rows = OC, b_cols = N, d_rows = C, d_cols = N;
      break;
    case Gemm::kBackwardWeight:  // D (C,OC) += inp (C x N) . op_T(dout: OC x N)
      tb = CUBLAS_OP_T;
      a_rows = C, a_cols = N, b_rows = OC, b_cols = N, d_rows = C, d_cols = OC;
      break;
  }
  ZO_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  if (k.op == Gemm::kForwardBias) {
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(type));
    // The heuristic reads the pointer's alignment (it never dereferences it).
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  // Packed column-major: the leading dimension is the row count.
  ZO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, type, a_rows, a_cols,
                                             static_cast<std::int64_t>(a_rows)));
  ZO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, type, b_rows, b_cols,
                                             static_cast<std::int64_t>(b_rows)));
  ZO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, type, d_rows, d_cols,
                                             static_cast<std::int64_t>(d_rows)));

  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(kWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(k.align_a));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(k.align_b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(k.align_d));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(k.align_d));

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(ctx.handle, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                     pref.get(), 1, &result, &returned);
  if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
    ZO_CUBLAS_CHECK(status);
  }
  plan->found = status == CUBLAS_STATUS_SUCCESS && returned > 0 &&
                result.state == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= kWorkspaceBytes;
  if (plan->found) {
    plan->algo = result.algo;
  } else if (k.op != Gemm::kForwardBias) {
    throw CublasError(CUBLAS_STATUS_NOT_SUPPORTED,
                      "cuBLASLt has no algorithm for " + describe(k) +
                          " on this GPU; the trainer needs compute capability 8.0 or newer");
  }
  return plan;
}

Plan& plan_for(MatmulContext& ctx, const PlanKey& key, const void* bias) {
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(key, make_plan(ctx, key, bias)).first;
  return *it->second;
}

// D = A-op-B (+ beta * D).
void run(MatmulContext& ctx, const Plan& p, const void* a, const void* b, void* d, float beta,
         cudaStream_t s) {
  const float alpha = 1.0f;
  ZO_CUBLAS_CHECK(cublasLtMatmul(ctx.handle, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d,
                                 &p.algo, ctx.workspace, kWorkspaceBytes, s));
}

using detail::bad_arg;

void check_common(const char* op, const MatmulContext* ctx, int N, int C, int OC, DType t) {
  if (ctx == nullptr) bad_arg(op, "the matmul context is null (create_matmul_context first)");
  if (N <= 0 || C <= 0 || OC <= 0) {
    bad_arg(op, "N = " + std::to_string(N) + ", C = " + std::to_string(C) +
                    ", OC = " + std::to_string(OC) + " must all be > 0");
  }
  (void)cuda_type(t);  // throws for an unknown dtype
}

void check_ptr(const char* op, const void* p, const char* name) {
  if (p == nullptr) bad_arg(op, std::string(name) + " is null");
}

}  // namespace

MatmulContext* create_matmul_context() {
  auto ctx = std::make_unique<MatmulContext>();
  ZO_CUDA_CHECK(cudaGetDevice(&ctx->device));
  ZO_CUBLAS_CHECK(cublasLtCreate(&ctx->handle));
  ZO_CUDA_CHECK(cudaMalloc(&ctx->workspace, kWorkspaceBytes));
  ZO_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->last_use, cudaEventDisableTiming));
  return ctx.release();
}

void destroy_matmul_context(MatmulContext* ctx) noexcept {
  delete ctx;
}

std::size_t matmul_plan_count(const MatmulContext* ctx) {
  if (ctx == nullptr) return 0;
  const std::lock_guard<std::mutex> lock(ctx->mu);
  return ctx->plans.size();
}

void launch_matmul_forward(MatmulContext* ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, DType t, cudaStream_t s) {
  constexpr const char* op = "launch_matmul_forward";
  check_common(op, ctx, N, C, OC, t);
  check_ptr(op, out, "out");
  check_ptr(op, inp, "inp");
  check_ptr(op, weight, "weight");
  const std::size_t es = dtype_size(t);
  const std::size_t c_pitch = static_cast<std::size_t>(C) * es;
  const std::size_t oc_pitch = static_cast<std::size_t>(OC) * es;
  PlanKey key{
      Gemm::kForward,           t, N, C, OC, alignment(weight, c_pitch), alignment(inp, c_pitch),
      alignment(out, oc_pitch), 0};
  Session session(*ctx, s);
  if (bias != nullptr) {
    PlanKey with_bias = key;
    with_bias.op = Gemm::kForwardBias;
    with_bias.align_bias = alignment(bias, 0);
    Plan& p = plan_for(*ctx, with_bias, bias);
    if (p.found) {
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
      run(*ctx, p, weight, inp, out, 0.0f, s);
      return;
    }
    // No epilogue kernel for these alignments: start from the broadcast bias and accumulate.
    launch_bias_broadcast(out, bias, N, OC, t, s);
    run(*ctx, plan_for(*ctx, key, nullptr), weight, inp, out, 1.0f, s);
    return;
  }
  run(*ctx, plan_for(*ctx, key, nullptr), weight, inp, out, 0.0f, s);
}

void launch_matmul_backward(MatmulContext* ctx, void* dinp, void* dweight, void* dbias,
                            const void* dout, const void* inp, const void* weight, int N, int C,
                            int OC, DType t, cudaStream_t s) {
  constexpr const char* op = "launch_matmul_backward";
  check_common(op, ctx, N, C, OC, t);
  check_ptr(op, dinp, "dinp");
  check_ptr(op, dweight, "dweight");
  check_ptr(op, dout, "dout");
  check_ptr(op, inp, "inp");
  check_ptr(op, weight, "weight");
  const std::size_t es = dtype_size(t);
  const std::size_t c_pitch = static_cast<std::size_t>(C) * es;
  const std::size_t oc_pitch = static_cast<std::size_t>(OC) * es;
  const PlanKey input_key{
      Gemm::kBackwardInput,     t, N, C, OC, alignment(weight, c_pitch), alignment(dout, oc_pitch),
      alignment(dinp, c_pitch), 0};
  const PlanKey weight_key{
      Gemm::kBackwardWeight,       t, N, C, OC, alignment(inp, c_pitch), alignment(dout, oc_pitch),
      alignment(dweight, c_pitch), 0};
  Session session(*ctx, s);
  run(*ctx, plan_for(*ctx, input_key, nullptr), weight, dout, dinp, 1.0f, s);
  run(*ctx, plan_for(*ctx, weight_key, nullptr), inp, dout, dweight, 1.0f, s);
  if (dbias != nullptr) {
    // Runs after the GEMMs on the same stream, so their workspace is free for the partial sums.
    launch_bias_backward(dbias, dout, N, OC, t, static_cast<float*>(ctx->workspace),
                         kWorkspaceBytes, s);
  }
}

}  // namespace zo::gpu
