// Host launchers of the GPT ops, includable from plain C++ (src/device/cuda_device.cpp adapts
// them to the zo::dev::Device interface, one line per op). Each op's kernels and launcher live in
// one gpu/src/<op>.cu; docs/gpu.md ("Adding an op") lists the places a new op touches. Each
// launcher checks its arguments (throwing std::invalid_argument), enqueues its kernel(s) on
// `stream` and checks the launch (ZO_CUDA_CHECK_LAUNCH); none synchronizes. Semantics, shapes and
// accumulation rules are exactly those of the same-named op in src/device/device.h, which the host
// backend implements in fp32 and which the tests use as the reference.
//
// `t` is the storage dtype of activations, parameters and their gradients (kF32, kF16 or kBF16);
// arithmetic is fp32. Statistics (mean, rstd, lse, losses, norms) are fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/adam.h"
#include "core/dtype.h"

namespace zo::gpu {

// ---- embedding (embedding.cu) ------------------------------------------------------------------
// out (B,T,C) written = wte[tokens[b,t]] + wpe[t]; wpe null: no learned positions (Llama).
void launch_embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                              const void* wpe, int B, int T, int C, DType t, cudaStream_t s);
// dwte (V,C) +=, dwpe (T,C) += (unless null) from dout (B,T,C). Deterministic (no float
// atomics). `scratch`:
// embedding_backward_scratch_bytes(B, T) device bytes, 256-aligned, kept until the launch has run.
std::size_t embedding_backward_scratch_bytes(int B, int T);
void launch_embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                               int B, int T, int C, DType t, void* scratch, cudaStream_t s);

// ---- layernorm (layernorm.cu), eps 1e-5 --------------------------------------------------------
void launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                              const void* weight, const void* bias, int N, int C, DType t,
                              cudaStream_t s);
// res (N,C) written = a + b, then layernorm_forward of res: one kernel, the bits of the two.
void launch_residual_layernorm_forward(void* res, void* out, float* mean, float* rstd,
                                       const void* a, const void* b, const void* weight,
                                       const void* bias, int N, int C, DType t, cudaStream_t s);
// dinp (N,C) written = dresidual + d(LN)/d(inp); dresidual (N,C) may be null (nothing to add) or
// dinp itself (accumulate in place). dweight, dbias (C) +=. Deterministic. `scratch`:
// layernorm_backward_scratch_bytes(N, C) device bytes, kept until the launch has run.
std::size_t layernorm_backward_scratch_bytes(int N, int C);
void launch_layernorm_backward(void* dinp, const void* dresidual, void* dweight, void* dbias,
                               const void* dout, const void* inp, const void* weight,
                               const float* mean, const float* rstd, int N, int C, DType t,
                               void* scratch, cudaStream_t s);

// ---- elementwise (elementwise.cu) -------------------------------------------------------------
void launch_gelu_forward(void* out, const void* inp, std::size_t n, DType t, cudaStream_t s);
// (gelu_backward is no longer used by the model: the matmul's DGELU epilogue, or its fallback,
// applies the GELU gradient.)
void launch_gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType t,
                          cudaStream_t s);  // dinp +=
void launch_residual_forward(void* out, const void* a, const void* b, std::size_t n, DType t,
                             cudaStream_t s);
void launch_accumulate(void* dst, const void* src, std::size_t n, DType t, cudaStream_t s);
// dst (n, fp32) += src (n, t): gradients summed over micro-batches in fp32.
void launch_accumulate_f32(float* dst, const void* src, std::size_t n, DType t, cudaStream_t s);

// ---- matmul through cuBLASLt (matmul.cpp, matmul_plan.cpp; fallback kernels matmul_bias.cu) ----
// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC, may be null); fp32 accumulation. `ld` is the
// row stride (elements, >= OC; 0 means OC) of out in the forward and of dout in the backward: the
// LM head pads its logits rows so that every GEMM operand is 16-byte aligned (model/gpt.h).
// Columns past OC are neither read nor written. Each GEMM runs with the cuBLASLt epilogue that
// fuses its neighbour (bias, GELU, GELU gradient, bias gradient) where cuBLASLt has an algorithm
// for it, else the plain GEMM and the kernel the epilogue stands for.
// The context holds the cuBLASLt handle, a 32 MiB workspace shared by the streams that use it
// (launches are serialised on it) and the cache of plans; one per device, made with that device
// current.
struct MatmulContext;
MatmulContext* create_matmul_context();
void destroy_matmul_context(MatmulContext* ctx) noexcept;
// Number of cached plans (descriptors + chosen algorithm), one per distinct (GEMM, epilogue,
// shapes, row stride, dtype, operand alignments); for tests, to see that steady-state calls hit
// the cache. Of those, the plans whose algorithm was chosen by timing several candidates (the
// first call of a key times the heuristic's top candidates on the stream; ZO_MATMUL_AUTOTUNE=0
// takes its first instead).
std::size_t matmul_plan_count(const MatmulContext* ctx);
std::size_t matmul_timed_plan_count(const MatmulContext* ctx);
// The OC of every cached plan, in no order: a GEMM whose OC is not a multiple of 8 (over 8) runs
// as an aligned one of OC rounded down to 8 and one of the remaining columns (matmul.cpp says why).
std::vector<int> matmul_plan_widths(const MatmulContext* ctx);
// The algorithm choices a context made by timing (or restored), as text a checkpoint keeps: a
// header naming the format, cuBLASLt's version and the GPU, then one line per plan, its key and
// cuBLASLt's algorithm structure (documented as storable for reuse with the same library
// version). Empty when nothing was timed. Two processes that time differently pick algorithms
// whose results differ in the last bits; a resumed run that imports the choices does not.
std::string export_matmul_choices(const MatmulContext* ctx);
// Takes another process's export: a plan made from now on for a recorded key uses the recorded
// algorithm without timing, where the heuristic offers it among its candidates. Returns "" when
// taken, else why not (another GPU or cuBLASLt version: the GEMMs are timed again). Throws
// std::invalid_argument for text that is not such an export.
std::string import_matmul_choices(MatmulContext* ctx, const std::string& text);
std::size_t matmul_restored_plan_count(const MatmulContext* ctx);
// out (N,OC; row stride ld) written.
void launch_matmul_forward(MatmulContext* ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, int ld, DType t, cudaStream_t s);
// pre (N,OC) written = inp @ weight^T + bias, out (N,OC) written = gelu(pre), tanh form (the MLP's
// first layer; pre is kept for the backward). Packed rows.
void launch_matmul_gelu_forward(MatmulContext* ctx, void* out, void* pre, const void* inp,
                                const void* weight, const void* bias, int N, int C, int OC, DType t,
                                cudaStream_t s);
// dinp (N,C) written; dweight (OC,C) +=; dbias (OC) += (skipped when null); dout row stride ld.
void launch_matmul_backward(MatmulContext* ctx, void* dinp, void* dweight, void* dbias,
                            const void* dout, const void* inp, const void* weight, int N, int C,
                            int OC, int ld, DType t, cudaStream_t s);
// launch_matmul_backward for inp = gelu(pre): dpre (N,C) written = gelu'(pre) * (dout @ weight)
// instead of dinp; pre (N,C). Packed rows.
void launch_matmul_dgelu_backward(MatmulContext* ctx, void* dpre, void* dweight, void* dbias,
                                  const void* dout, const void* inp, const void* weight,
                                  const void* pre, int N, int C, int OC, DType t, cudaStream_t s);

// ---- attention (attention_forward.cu, attention_backward.cu) ----------------------------------
// Shapes of attention and the rotary embedding (dev::AttentionArgs): NH query heads, NKV key/value
// heads (a divisor of NH; query head h reads kv head h / (NH / NKV)), head size hs. qkv (B, T,
// (NH + 2 NKV) hs) per token as [q (NH hs) | k (NKV hs) | v (NKV hs)]; out (B, T, NH hs).
struct AttentionDims {
  int B, T, NH, NKV, hs;
  int pos0 = 0;  // RoPE: the position of each sequence's first row (a decode step's position)
};
// Causal, flash-style: never materialises (B,NH,T,T). bf16/fp16 with head sizes 64 and 128 run on
// tensor cores (fp32 accumulation), everything else on fp32 FMA; both deterministic.
// out written; lse (B,NH,T) fp32 written (natural log of the row sums of exp(score) with
// score = q.k / sqrt(hs)).
void launch_attention_forward(void* out, float* lse, const void* qkv, const AttentionDims& d,
                              DType t, cudaStream_t s);
// dqkv written (every element once); the dk, dv of a kv head sum over its query heads in a fixed
// order. `scratch` holds
// attention_backward_scratch_floats(d) = B*NH*T floats (D = rowsum(dout * out)); the caller keeps
// it alive until the launch has run.
std::size_t attention_backward_scratch_floats(const AttentionDims& d);  // checks the shape
void launch_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, float* scratch, const AttentionDims& d, DType t,
                               cudaStream_t s);

// Decode attention (attention_decode.cu): per sequence b, the query of position pos (0 <= pos < T)
// attends to the keys and values of positions [0, pos] of qkv (B, T, (NH + 2 NKV) hs), the KV
// cache; out (B, NH hs) written. Rows past pos are not read. `scratch`:
// attention_decode_scratch_floats(d) floats (none: may be null), for the positions split across
// blocks when B x NH blocks alone would leave SMs idle; the size follows the current device's SM
// count, so compute it with the launch's device current.
std::size_t attention_decode_scratch_floats(const AttentionDims& d);
void launch_attention_decode(void* out, const void* qkv, int pos, const AttentionDims& d, DType t,
                             float* scratch, cudaStream_t s);

// ---- Llama-family ops (rmsnorm.cu, rope.cu, swiglu.cu) -----------------------------------------
// out (N,C) written = inp * rstd * weight; rstd (N) fp32 written = 1 / sqrt(mean(inp^2) + eps).
void launch_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N,
                            int C, float eps, DType t, cudaStream_t s);
// dinp (N,C) written = dresidual + d(RMSNorm)/d(inp); dresidual (N,C) may be null or dinp itself.
// dweight (C) +=. Deterministic.
void launch_rmsnorm_backward(void* dinp, const void* dresidual, void* dweight, const void* dout,
                             const void* inp, const void* weight, const float* rstd, int N, int C,
                             DType t, cudaStream_t s);
// The q and k heads of qkv rotated in place by (d.pos0 + t) * inv_freq[i] (Hugging Face's
// rotate_half pairs (i, i + hs/2)); the backward rotates dq, dk back (the transpose). inv_freq
// (hs/2) fp32; hs even.
void launch_rope_forward(void* qkv, const float* inv_freq, const AttentionDims& d, DType t,
                         cudaStream_t s);
void launch_rope_backward(void* dqkv, const float* inv_freq, const AttentionDims& d, DType t,
                          cudaStream_t s);
// out (N,I) written = silu(gate) * up, gate_up (N, 2I) rows [gate | up]; the backward writes
// dgate_up (N, 2I) = [dgate | dup] from dout (N, I); dgate_up may be gate_up.
void launch_swiglu_forward(void* out, const void* gate_up, int N, int I, DType t, cudaStream_t s);
void launch_swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, int N, int I,
                            DType t, cudaStream_t s);

// ---- loss and reductions (cross_entropy.cu, reduce.cu) ----------------------------------------
// losses (N) fp32 written; dlogits (may alias logits or be null) written with
// dloss_scale * (softmax - onehot). logits and dlogits rows are ld >= V elements apart; the
// columns past V are neither read nor written.
void launch_cross_entropy(float* losses, void* dlogits, const void* logits,
                          const std::int32_t* targets, int N, int V, int ld, float dloss_scale,
                          DType t, cudaStream_t s);
// *out += sum of squares of data (n); deterministic (fixed grid, fixed-order final reduction).
// `scratch`: sum_squares_scratch_bytes(n) device bytes, kept until the launch has run.
std::size_t sum_squares_scratch_bytes(std::size_t n);
void launch_sum_squares(float* out, const void* data, std::size_t n, DType t, void* scratch,
                        cudaStream_t s);
// *flag = 1 if any element is Inf/NaN (left unchanged otherwise).
void launch_nonfinite_flag(float* flag, const void* data, std::size_t n, DType t, cudaStream_t s);
// *gate = step_gate(*sumsq, rule) (core/adam.h), one thread (step_gate.cu).
void launch_step_gate(StepGate* gate, const float* sumsq, const StepGateRule& rule, cudaStream_t s);

// ---- AdamW for the GPU-resident mode (adamw.cu) -----------------------------------------------
// The same math as cpu_adam (core/adam.h, docs/cpu_adam.md): fp32 master/m/v on the device, grads
// (n, gt) times grad_mult; params_out (n, pt) written with the new params when non-null. Update
// number t; decoupled weight decay only. With a run table (run_starts: num_runs >= 1 entries in
// device memory, 8-byte aligned, core/adam.h's format, starting at 0, ascending, below n) weight
// decay c.weight_decay applies only in the runs marked for it; without, to every element. With a
// gate (device memory, launch_step_gate) its multiplier replaces grad_mult, and a skip leaves
// everything as it was.
void launch_adamw(float* master, float* m, float* v, const void* grads, DType gt, void* params_out,
                  DType pt, std::size_t n, const AdamConfig& c, std::int64_t t, float grad_mult,
                  cudaStream_t s, const std::uint64_t* run_starts = nullptr, int num_runs = 0,
                  const StepGate* gate = nullptr);

// ---- element-type conversion (cast.cu) ---------------------------------------------------------
// dst[i] = src[i] converted from src_t to dst_t for i < n. Narrowing rounds to nearest, ties to
// even, keeps subnormals and overflows to infinity, bit for bit as zo::float_to_half /
// zo::float_to_bf16 (NaNs stay NaN; their payload may differ). fp16 <-> bf16 goes through fp32,
// so it rounds once. Equal types are a device-to-device copy. Both arrays must be
// device-accessible and must not overlap (unless src == dst, same type). Throws
// std::invalid_argument for null pointers with n > 0, overlap or an invalid DType.
void launch_cast(const void* src, DType src_t, void* dst, DType dst_t, std::size_t n,
                 cudaStream_t s);

}  // namespace zo::gpu
