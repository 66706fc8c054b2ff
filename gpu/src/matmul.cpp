// The matmul op's launchers (gpu/ops.h) over the cuBLASLt plans of matmul_plan.h. Each GEMM runs
// with the epilogue that fuses the op next to it where cuBLASLt has an algorithm for it and
// accepts the call:
//   forward          BIAS, or GELU_AUX_BIAS (out = gelu(x), pre = x) for the MLP's first layer
//   backward input   written (beta = 0); DGELU (times gelu'(pre)) below a GELU
//   backward weight  accumulated (beta = 1); BGRADB (the bias gradient, written to the
//                    workspace's last MiB, then added to dbias by a small kernel)
// Otherwise the plain GEMM and the kernel the epilogue stands for (matmul_bias.h): the broadcast
// bias under an accumulating GEMM, the GELU kernel, the GELU gradient in place, the bias-gradient
// column sums. A refused epilogue plan is remembered, so the fallback costs nothing after once.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cublaslt_api.h"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"
#include "matmul_bias.h"
#include "matmul_plan.h"

namespace zo::gpu {
namespace {

// Largest power of two (<= 256) dividing both the address and the row pitch.
std::uint16_t alignment(const void* p, std::size_t pitch_bytes) {
  const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(p) | pitch_bytes | 256u;
  return static_cast<std::uint16_t>(bits & (~bits + 1));
}

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
  // In a graph capture the record becomes a node of the graph (cudaEventRecordExternal), so
  // that each replay marks the workspace's last use as an eager launch does.
  ~Session() {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const unsigned flags = cudaStreamIsCapturing(stream_, &capture) == cudaSuccess &&
                                   capture == cudaStreamCaptureStatusActive
                               ? cudaEventRecordExternal
                               : cudaEventRecordDefault;
    if (cudaEventRecordWithFlags(ctx_.last_use, stream_, flags) == cudaSuccess) {
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

using detail::bad_arg;

// The row stride, ld = 0 meaning OC. Throws for bad shapes, dtype or stride.
int check_common(const char* op, const MatmulContext* ctx, int N, int C, int OC, int ld, DType t) {
  if (ctx == nullptr) bad_arg(op, "the matmul context is null (create_matmul_context first)");
  if (N <= 0 || C <= 0 || OC <= 0) {
    bad_arg(op, "N = " + std::to_string(N) + ", C = " + std::to_string(C) +
                    ", OC = " + std::to_string(OC) + " must all be > 0");
  }
  if (ld != 0 && ld < OC) {
    bad_arg(op, "the row stride ld = " + std::to_string(ld) +
                    " is less than OC = " + std::to_string(OC));
  }
  if (!detail::valid_dtype(t)) {
    bad_arg(op, "unknown dtype value " + std::to_string(static_cast<int>(t)) +
                    " (expected fp32, fp16 or bf16)");
  }
  return ld == 0 ? OC : ld;
}

// cuBLASLt has only align-1 kernels (pre-Hopper CUTLASS tiles, no TMA) for a GEMM whose OC, the
// output's contiguous width in the forward and the reduced width in the backward, is not a
// multiple of 8 elements, whatever the pointers and row strides: on an H100 GPT-2's LM head
// (OC = V = 50257) took 30 of a 124M step's 60 ms that way (2026-11-27). Such a GEMM runs as two:
// the first OC rounded down to 8 (aligned) and the remaining OC % 8 columns (tiny).
constexpr int kVectorWidth = 8;
int unaligned_tail(int OC) {
  return OC > kVectorWidth ? OC % kVectorWidth : 0;
}

const void* advance(const void* p, std::size_t elements, DType t) {
  return p == nullptr ? nullptr : static_cast<const char*>(p) + elements * dtype_size(t);
}
void* advance(void* p, std::size_t elements, DType t) {
  return p == nullptr ? nullptr : static_cast<char*>(p) + elements * dtype_size(t);
}

// The key of one GEMM without epilogue, from its operands' addresses and row pitches in bytes.
PlanKey plain_key(Gemm op, DType t, int N, int C, int OC, int ld, const void* a,
                  std::size_t a_pitch, const void* b, std::size_t b_pitch, const void* d,
                  std::size_t d_pitch) {
  return {op,
          Epilogue::kNone,
          t,
          N,
          C,
          OC,
          ld,
          alignment(a, a_pitch),
          alignment(b, b_pitch),
          alignment(d, d_pitch),
          0,
          0};
}

// Runs the GEMM with key's epilogue. False, with nothing enqueued, when cuBLASLt has no algorithm
// for it or refuses the call; a refused plan is not tried again.
bool try_epilogue(MatmulContext& ctx, const PlanKey& key, const Operands& ops, cudaStream_t s) {
  Plan& p = plan_for(ctx, key, ops, s);
  if (!p.found) return false;
  const cublasStatus_t status = run_plan(ctx, p, ops, s);
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE) {
    ZO_CUBLAS_CHECK(status);
  }
  p.found = false;
  return false;
}

// The GEMM without epilogue.
void run_plain(MatmulContext& ctx, PlanKey key, const Operands& ops, cudaStream_t s) {
  key.epilogue = Epilogue::kNone;
  key.align_bias = key.align_aux = 0;
  ZO_CUBLAS_CHECK(run_plan(ctx, plan_for(ctx, key, ops, s), ops, s));
}

// out (N,OC; ld) written = inp @ weight^T + bias.
void forward(MatmulContext& ctx, void* out, const void* inp, const void* weight, const void* bias,
             int N, int C, int OC, int ld, DType t, cudaStream_t s) {
  if (const int tail = unaligned_tail(OC); tail != 0) {
    const int head = OC - tail;
    forward(ctx, out, inp, weight, bias, N, C, head, ld, t, s);
    forward(ctx, advance(out, head, t), inp, advance(weight, std::size_t(head) * C, t),
            advance(bias, head, t), N, C, tail, ld, t, s);
    return;
  }
  const std::size_t es = dtype_size(t), c_pitch = std::size_t(C) * es;
  const PlanKey key = plain_key(Gemm::kForward, t, N, C, OC, ld, weight, c_pitch, inp, c_pitch, out,
                                std::size_t(ld) * es);
  Operands ops{weight, inp, out, 0.0f, const_cast<void*>(bias), nullptr};
  if (bias != nullptr) {
    PlanKey with_bias = key;
    with_bias.epilogue = Epilogue::kBias;
    with_bias.align_bias = alignment(bias, 0);
    if (try_epilogue(ctx, with_bias, ops, s)) return;
    // Start from the broadcast bias and accumulate: the product is rounded once, as in BIAS.
    launch_bias_broadcast(out, bias, N, OC, ld, t, s);
    ops.beta = 1.0f;
  }
  run_plain(ctx, key, ops, s);
}

// dinp (N,C) = dout[:, :OC] @ weight (written with beta 0, accumulated with beta 1), times
// gelu'(pre) when pre is non-null (beta 0 only).
void backward_input(MatmulContext& ctx, void* dinp, const void* dout, const void* weight,
                    const void* pre, float beta, int N, int C, int OC, int ld, DType t,
                    cudaStream_t s) {
  const std::size_t es = dtype_size(t), c_pitch = std::size_t(C) * es;
  const PlanKey key = plain_key(Gemm::kBackwardInput, t, N, C, OC, ld, weight, c_pitch, dout,
                                std::size_t(ld) * es, dinp, c_pitch);
  const Operands ops{weight, dout, dinp, beta, nullptr, const_cast<void*>(pre)};
  if (pre != nullptr && C % 8 == 0) {  // cuBLASLt wants the aux leading dimension a multiple of 8
    PlanKey k = key;
    k.epilogue = Epilogue::kDgelu;
    k.align_aux = alignment(pre, c_pitch);
    if (try_epilogue(ctx, k, ops, s)) return;
  }
  run_plain(ctx, key, ops, s);
  if (pre != nullptr) launch_gelu_grad_in_place(dinp, pre, std::size_t(N) * C, t, s);
}

// dweight (OC,C) += dout[:, :OC]^T @ inp; dbias (OC) += column sums of dout, when non-null.
void backward_weight(MatmulContext& ctx, void* dweight, void* dbias, const void* dout,
                     const void* inp, int N, int C, int OC, int ld, DType t, cudaStream_t s) {
  const std::size_t es = dtype_size(t), c_pitch = std::size_t(C) * es;
  const PlanKey key = plain_key(Gemm::kBackwardWeight, t, N, C, OC, ld, inp, c_pitch, dout,
                                std::size_t(ld) * es, dweight, c_pitch);
  Operands ops{inp, dout, dweight, 1.0f, nullptr, nullptr};
  if (dbias != nullptr && std::size_t(OC) * es <= kBiasGradBytes) {
    PlanKey k = key;
    k.epilogue = Epilogue::kBgradB;
    k.align_bias = alignment(ctx.bias_grad(), 0);
    ops.bias = ctx.bias_grad();
    if (try_epilogue(ctx, k, ops, s)) {
      launch_accumulate(dbias, ctx.bias_grad(), std::size_t(OC), t, s);  // BGRADB overwrites
      return;
    }
    ops.bias = nullptr;
  }
  run_plain(ctx, key, ops, s);
  if (dbias != nullptr) {
    // Runs after the GEMMs on the same stream, so their workspace is free for the partial sums.
    launch_bias_backward(dbias, dout, N, OC, ld, t, static_cast<float*>(ctx.workspace),
                         kWorkspaceBytes, s);
  }
}

// dinp written (times gelu'(pre) when pre is non-null), dweight +=, dbias +=. An unaligned OC
// splits into an aligned head and a tail (unaligned_tail): dinp sums the two products, rounded
// once more in 16-bit storage, and gelu'(pre) applies after both.
void backward(MatmulContext& ctx, void* dinp, void* dweight, void* dbias, const void* dout,
              const void* inp, const void* weight, const void* pre, int N, int C, int OC, int ld,
              DType t, cudaStream_t s) {
  const int tail = unaligned_tail(OC);
  if (tail == 0) {
    backward_input(ctx, dinp, dout, weight, pre, 0.0f, N, C, OC, ld, t, s);
    backward_weight(ctx, dweight, dbias, dout, inp, N, C, OC, ld, t, s);
    return;
  }
  const int head = OC - tail;
  const void* dout_tail = advance(dout, head, t);
  const std::size_t tail_rows = std::size_t(head) * C;
  backward_input(ctx, dinp, dout, weight, nullptr, 0.0f, N, C, head, ld, t, s);
  backward_input(ctx, dinp, dout_tail, advance(weight, tail_rows, t), nullptr, 1.0f, N, C, tail, ld,
                 t, s);
  if (pre != nullptr) launch_gelu_grad_in_place(dinp, pre, std::size_t(N) * C, t, s);
  backward_weight(ctx, dweight, dbias, dout, inp, N, C, head, ld, t, s);
  backward_weight(ctx, advance(dweight, tail_rows, t), advance(dbias, head, t), dout_tail, inp, N,
                  C, tail, ld, t, s);
}

}  // namespace

MatmulContext* create_matmul_context() {
  auto ctx = std::make_unique<MatmulContext>();
  ZO_CUDA_CHECK(cudaGetDevice(&ctx->device));
  ZO_CUBLAS_CHECK(cublaslt().cublasLtCreate(&ctx->handle));
  ZO_CUDA_CHECK(cudaMalloc(&ctx->workspace, kWorkspaceBytes));
  ZO_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->last_use, cudaEventDisableTiming));
  const char* autotune = std::getenv("ZO_MATMUL_AUTOTUNE");
  ctx->autotune = autotune == nullptr || std::strcmp(autotune, "0") != 0;
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

std::vector<int> matmul_plan_widths(const MatmulContext* ctx) {
  std::vector<int> widths;
  if (ctx == nullptr) return widths;
  const std::lock_guard<std::mutex> lock(ctx->mu);
  for (const auto& entry : ctx->plans)
    widths.push_back(entry.first.OC);
  return widths;
}

std::size_t matmul_timed_plan_count(const MatmulContext* ctx) {
  if (ctx == nullptr) return 0;
  const std::lock_guard<std::mutex> lock(ctx->mu);
  std::size_t timed = 0;
  for (const auto& entry : ctx->plans)
    timed += entry.second->timed ? 1 : 0;
  return timed;
}

void launch_matmul_forward(MatmulContext* ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, int ld, DType t,
                           cudaStream_t s) {
  constexpr const char* op = "launch_matmul_forward";
  ld = check_common(op, ctx, N, C, OC, ld, t);
  detail::check_not_null(op, {{out, "out"}, {inp, "inp"}, {weight, "weight"}});
  Session session(*ctx, s);
  forward(*ctx, out, inp, weight, bias, N, C, OC, ld, t, s);
}

void launch_matmul_gelu_forward(MatmulContext* ctx, void* out, void* pre, const void* inp,
                                const void* weight, const void* bias, int N, int C, int OC, DType t,
                                cudaStream_t s) {
  constexpr const char* op = "launch_matmul_gelu_forward";
  check_common(op, ctx, N, C, OC, 0, t);
  detail::check_not_null(op, {{out, "out"}, {pre, "pre"}, {inp, "inp"}, {weight, "weight"}});
  Session session(*ctx, s);
  const std::size_t es = dtype_size(t), c_pitch = std::size_t(C) * es;
  const std::size_t oc_pitch = std::size_t(OC) * es;
  if (OC % 8 == 0) {  // cuBLASLt wants the aux leading dimension a multiple of 8
    PlanKey key =
        plain_key(Gemm::kForward, t, N, C, OC, OC, weight, c_pitch, inp, c_pitch, out, oc_pitch);
    key.epilogue = bias != nullptr ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux;
    key.align_bias = bias != nullptr ? alignment(bias, 0) : 0;
    key.align_aux = alignment(pre, oc_pitch);
    if (try_epilogue(*ctx, key, {weight, inp, out, 0.0f, const_cast<void*>(bias), pre}, s)) return;
  }
  forward(*ctx, pre, inp, weight, bias, N, C, OC, OC, t, s);
  launch_gelu_forward(out, pre, std::size_t(N) * OC, t, s);
}

void launch_matmul_backward(MatmulContext* ctx, void* dinp, void* dweight, void* dbias,
                            const void* dout, const void* inp, const void* weight, int N, int C,
                            int OC, int ld, DType t, cudaStream_t s) {
  constexpr const char* op = "launch_matmul_backward";
  ld = check_common(op, ctx, N, C, OC, ld, t);
  detail::check_not_null(
      op, {{dinp, "dinp"}, {dweight, "dweight"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}});
  Session session(*ctx, s);
  backward(*ctx, dinp, dweight, dbias, dout, inp, weight, nullptr, N, C, OC, ld, t, s);
}

void launch_matmul_dgelu_backward(MatmulContext* ctx, void* dpre, void* dweight, void* dbias,
                                  const void* dout, const void* inp, const void* weight,
                                  const void* pre, int N, int C, int OC, DType t, cudaStream_t s) {
  constexpr const char* op = "launch_matmul_dgelu_backward";
  check_common(op, ctx, N, C, OC, 0, t);
  detail::check_not_null(op, {{dpre, "dpre"},
                              {dweight, "dweight"},
                              {dout, "dout"},
                              {inp, "inp"},
                              {weight, "weight"},
                              {pre, "pre"}});
  Session session(*ctx, s);
  backward(*ctx, dpre, dweight, dbias, dout, inp, weight, pre, N, C, OC, OC, t, s);
}

}  // namespace zo::gpu
