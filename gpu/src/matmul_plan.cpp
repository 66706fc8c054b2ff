// cuBLASLt plans of the matmul op (matmul_plan.h). Our tensors are row-major and cuBLASLt's are
// column-major; a row-major (R, K) array is the column-major (K, R) array with the same bytes, so
// each GEMM is written for the transposes (ld: the row stride of out / dout, >= OC):
//   forward          out^T (OC,N; ld)  = W (OC,C) . inp^T (C,N)      W is stored as (C,OC): op T
//   backward input   dinp^T (C,N)      = W^T (C,OC) . dout^T (OC,N; ld)
//   backward weight  dW^T (C,OC)      += inp^T (C,N) . dout (N,OC)    dout is stored as (OC,N): op
//   T
// Compute is fp32 for every storage type (CUBLAS_COMPUTE_32F: true fp32 for fp32 storage, never
// TF32). Epilogues: BIAS and GELU_AUX(_BIAS) on the forward (the aux matrix is the GELU input,
// laid out as D), DGELU on the input gradient (aux: the forward's GELU input, laid out as D),
// BGRADB on the weight gradient (dout's column sums: the bias gradient, into the workspace's
// last MiB in D's type).
//
// Choosing by timing: the heuristic ranks by a model, not by the clock, and on an H100 its first
// pick is not always the fastest for skinny or odd shapes. When it returns several usable
// candidates (up to kCandidates), each runs once to warm up and kTimedRuns times between two
// events on the stream, and the fastest is kept for the run. That happens once per plan key (the
// first step), with a host wait for the events. A call that accumulates (beta != 0) is timed
// into stream-ordered scratch instead of its output, so timing never changes a result. A run's
// choice is not bit-reproducible across processes (another run may time differently);
// ZO_MATMUL_AUTOTUNE=0 takes the heuristic's first candidate instead.
#include "matmul_plan.h"

#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "cublaslt_api.h"

namespace zo::gpu {
namespace {

constexpr int kCandidates = 4;
constexpr int kTimedRuns = 3;

std::string cublas_status_text(cublasStatus_t status) {
  std::string text = cublaslt().cublasLtGetStatusName(status);
  text += " (";
  text += cublaslt().cublasLtGetStatusString(status);
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

const char* gemm_name(Gemm g) {
  switch (g) {
    case Gemm::kForward:
      return "forward";
    case Gemm::kBackwardInput:
      return "backward (input gradient)";
    case Gemm::kBackwardWeight:
      return "backward (weight gradient)";
  }
  return "?";
}

// Per Epilogue, in enum order: the name in messages, cuBLASLt's value, whether it uses the bias
// pointer and the aux matrix.
struct EpilogueTraits {
  const char* name;
  cublasLtEpilogue_t lt;
  bool bias, aux;
};
constexpr EpilogueTraits kEpilogues[] = {
    {"", CUBLASLT_EPILOGUE_DEFAULT, false, false},
    {" with bias", CUBLASLT_EPILOGUE_BIAS, true, false},
    {" with GELU", CUBLASLT_EPILOGUE_GELU_AUX, false, true},
    {" with bias and GELU", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, true},
    {" with the GELU gradient", CUBLASLT_EPILOGUE_DGELU, false, true},
    {" with the bias gradient", CUBLASLT_EPILOGUE_BGRADB, true, false},
};
const EpilogueTraits& traits(Epilogue e) {
  return kEpilogues[static_cast<std::size_t>(e)];
}

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

template <typename V>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  ZO_CUBLAS_CHECK(cublaslt().cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}

// The pointers the descriptor carries (the heuristic reads their alignment; a call, its data).
void set_pointers(const Plan& p, const Operands& ops) {
  if (traits(p.epilogue).bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, ops.bias);
  if (traits(p.epilogue).aux) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, ops.aux);
}

class Preference {
 public:
  Preference() { ZO_CUBLAS_CHECK(cublaslt().cublasLtMatmulPreferenceCreate(&pref_)); }
  ~Preference() { (void)cublaslt().cublasLtMatmulPreferenceDestroy(pref_); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;

  template <typename V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, V value) {
    ZO_CUBLAS_CHECK(
        cublaslt().cublasLtMatmulPreferenceSetAttribute(pref_, attr, &value, sizeof value));
  }
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

// Descriptors and layouts for the key; D's leading dimension is the row stride of out (forward),
// the packed C otherwise.
void describe_gemm(Plan& plan, const PlanKey& k) {
  const cudaDataType_t type = cuda_type(k.t);
  const auto N = static_cast<std::uint64_t>(k.N), C = static_cast<std::uint64_t>(k.C),
             OC = static_cast<std::uint64_t>(k.OC), ld = static_cast<std::uint64_t>(k.ld);
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  std::uint64_t a_rows = C, a_cols = 0, b_rows = 0, b_ld = 0, d_rows = 0, d_cols = 0, d_ld = 0;
  switch (k.op) {
    case Gemm::kForward:  // D (OC,N; ld) = op_T(W: C x OC) . inp (C x N)
      ta = CUBLAS_OP_T;
      a_cols = OC, b_rows = C, b_ld = C, d_rows = OC, d_cols = N, d_ld = ld;
      break;
    case Gemm::kBackwardInput:  // D (C,N) = W (C x OC) . dout (OC x N; ld)
      a_cols = OC, b_rows = OC, b_ld = ld, d_rows = C, d_cols = N, d_ld = C;
      break;
    case Gemm::kBackwardWeight:  // D (C,OC) += inp (C x N) . op_T(dout: OC x N; ld)
      tb = CUBLAS_OP_T;
      a_cols = N, b_rows = OC, b_ld = ld, d_rows = C, d_cols = OC, d_ld = C;
      break;
  }
  plan.epilogue = k.epilogue;
  ZO_CUBLAS_CHECK(cublaslt().cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, traits(k.epilogue).lt);
  if (traits(k.epilogue).bias) {
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(type));
  }
  if (traits(k.epilogue).aux) {
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<std::int64_t>(d_ld));
  }
  ZO_CUBLAS_CHECK(cublaslt().cublasLtMatrixLayoutCreate(&plan.a, type, a_rows, a_cols,
                                                        static_cast<std::int64_t>(a_rows)));
  ZO_CUBLAS_CHECK(cublaslt().cublasLtMatrixLayoutCreate(&plan.b, type, b_rows, N,
                                                        static_cast<std::int64_t>(b_ld)));
  ZO_CUBLAS_CHECK(cublaslt().cublasLtMatrixLayoutCreate(&plan.d, type, d_rows, d_cols,
                                                        static_cast<std::int64_t>(d_ld)));
  plan.d_bytes = d_ld * d_cols * dtype_size(k.t);
}

// The usable candidates, best first by the heuristic's ranking.
std::vector<cublasLtMatmulAlgo_t> candidates(MatmulContext& ctx, const Plan& plan,
                                             const PlanKey& k) {
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
           static_cast<std::uint64_t>(kGemmWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(k.align_a));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(k.align_b));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(k.align_d));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(k.align_d));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  const cublasStatus_t status = cublaslt().cublasLtMatmulAlgoGetHeuristic(
      ctx.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref.get(), kCandidates, results,
      &returned);
  std::vector<cublasLtMatmulAlgo_t> usable;
  // An epilogue the library cannot do for these operands is a fallback, not an error.
  if (status != CUBLAS_STATUS_SUCCESS) {
    if (k.epilogue == Epilogue::kNone && status != CUBLAS_STATUS_NOT_SUPPORTED) {
      ZO_CUBLAS_CHECK(status);
    }
    return usable;
  }
  for (int i = 0; i < returned && i < kCandidates; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS &&
        results[i].workspaceSize <= kGemmWorkspaceBytes) {
      usable.push_back(results[i].algo);
    }
  }
  return usable;
}

// RAII events for timing.
struct TimingEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  TimingEvents() {
    ZO_CUDA_CHECK(cudaEventCreateWithFlags(&start, cudaEventDefault));
    ZO_CUDA_CHECK(cudaEventCreateWithFlags(&stop, cudaEventDefault));
  }
  ~TimingEvents() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
};

// Index of the fastest candidate (plan.timed set); 0 when timing is impossible (no scratch for an
// accumulating call). A candidate cuBLASLt refuses at the call is skipped; -1 when all are.
int fastest(MatmulContext& ctx, Plan& plan, const std::vector<cublasLtMatmulAlgo_t>& algos,
            Operands ops, cudaStream_t s) {
  struct Scratch {
    void* p = nullptr;
    cudaStream_t s;
    ~Scratch() {
      if (p != nullptr) (void)cudaFreeAsync(p, s);
    }
  } scratch{nullptr, s};
  if (ops.beta != 0.0f) {  // time into scratch so that the real output accumulates only once
    if (cudaMallocAsync(&scratch.p, plan.d_bytes, s) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    ops.d = scratch.p;
    ops.beta = 0.0f;
  }
  int best = -1;
  float best_ms = 0.0f;
  {
    const TimingEvents ev;
    for (int i = 0; i < static_cast<int>(algos.size()); ++i) {
      plan.algo = algos[static_cast<std::size_t>(i)];
      if (run_plan(ctx, plan, ops, s) != CUBLAS_STATUS_SUCCESS) continue;  // also the warm-up
      ZO_CUDA_CHECK(cudaEventRecord(ev.start, s));
      for (int r = 0; r < kTimedRuns; ++r)
        ZO_CUBLAS_CHECK(run_plan(ctx, plan, ops, s));
      ZO_CUDA_CHECK(cudaEventRecord(ev.stop, s));
      ZO_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float ms = 0.0f;
      ZO_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
      if (best < 0 || ms < best_ms) best = i, best_ms = ms;
    }
  }
  plan.timed = best >= 0;
  return best;
}

std::unique_ptr<Plan> make_plan(MatmulContext& ctx, const PlanKey& k, const Operands& ops,
                                cudaStream_t s) {
  auto plan = std::make_unique<Plan>();
  describe_gemm(*plan, k);
  set_pointers(*plan, ops);
  const std::vector<cublasLtMatmulAlgo_t> algos = candidates(ctx, *plan, k);
  int chosen = algos.empty() ? -1 : 0;
  // A restored choice counts only if this library offers the same algorithm for the same GEMM.
  if (const auto r = ctx.restored.find(k); r != ctx.restored.end()) {
    for (std::size_t i = 0; i < algos.size(); ++i) {
      if (std::memcmp(&algos[i], &r->second, sizeof(cublasLtMatmulAlgo_t)) == 0) {
        chosen = static_cast<int>(i);
        plan->restored = true;
      }
    }
  }
  if (algos.size() > 1 && ctx.autotune && !plan->restored) {
    chosen = fastest(ctx, *plan, algos, ops, s);
  }
  plan->found = chosen >= 0;
  if (plan->found) {
    plan->algo = algos[static_cast<std::size_t>(chosen)];
  } else if (k.epilogue == Epilogue::kNone) {
    throw CublasError(CUBLAS_STATUS_NOT_SUPPORTED,
                      "cuBLASLt has no algorithm for " + describe(k) +
                          " on this GPU; the trainer needs compute capability 8.0 or newer");
  }
  return plan;
}

}  // namespace

namespace detail {

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

}  // namespace detail

Plan::~Plan() {
  if (d != nullptr) (void)cublaslt().cublasLtMatrixLayoutDestroy(d);
  if (b != nullptr) (void)cublaslt().cublasLtMatrixLayoutDestroy(b);
  if (a != nullptr) (void)cublaslt().cublasLtMatrixLayoutDestroy(a);
  if (desc != nullptr) (void)cublaslt().cublasLtMatmulDescDestroy(desc);
}

MatmulContext::~MatmulContext() {
  int previous = -1;
  const bool switched = device >= 0 && cudaGetDevice(&previous) == cudaSuccess &&
                        previous != device && cudaSetDevice(device) == cudaSuccess;
  // Work still queued may use the workspace: wait for it before freeing.
  if (last_use != nullptr && used) (void)cudaEventSynchronize(last_use);
  plans.clear();
  if (handle != nullptr) (void)cublaslt().cublasLtDestroy(handle);
  if (workspace != nullptr && cudaFree(workspace) != cudaSuccess) {
    std::fprintf(stderr, "warning: cudaFree of the cuBLASLt workspace failed\n");
  }
  if (last_use != nullptr) (void)cudaEventDestroy(last_use);
  if (switched) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();  // nothing from teardown may surface in a later launch check
}

std::string describe(const PlanKey& k) {
  std::ostringstream s;
  s << "matmul " << gemm_name(k.op) << traits(k.epilogue).name << " N=" << k.N << " C=" << k.C
    << " OC=" << k.OC;
  if (k.ld != k.OC) s << " ld=" << k.ld;
  s << " dtype=" << dtype_name(k.t) << " (operand alignments " << k.align_a << '/' << k.align_b
    << '/' << k.align_d << " bytes";
  if (traits(k.epilogue).bias) s << ", bias " << k.align_bias;
  if (traits(k.epilogue).aux) s << ", aux " << k.align_aux;
  s << ')';
  return s.str();
}

Plan& plan_for(MatmulContext& ctx, const PlanKey& key, const Operands& ops, cudaStream_t s) {
  auto it = ctx.plans.find(key);
  if (it == ctx.plans.end()) it = ctx.plans.emplace(key, make_plan(ctx, key, ops, s)).first;
  return *it->second;
}

cublasStatus_t run_plan(MatmulContext& ctx, const Plan& p, const Operands& ops, cudaStream_t s) {
  set_pointers(p, ops);
  const float alpha = 1.0f;
  return cublaslt().cublasLtMatmul(ctx.handle, p.desc, &alpha, ops.a, p.a, ops.b, p.b, &ops.beta,
                                   ops.d, p.d, ops.d, p.d, &p.algo, ctx.workspace,
                                   kGemmWorkspaceBytes, s);
}

}  // namespace zo::gpu
