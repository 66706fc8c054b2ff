// Host launchers of the GPT ops, includable from plain C++ (src/device/cuda_device.cpp adapts
// them to the zo::dev::Device interface). Each launcher checks its arguments (throwing
// std::invalid_argument), enqueues its kernel(s) on `stream` and checks the launch
// (ZO_CUDA_CHECK_LAUNCH); none synchronizes. Semantics, shapes and accumulation rules are exactly
// those of the same-named op in src/device/device.h, which the host backend implements in fp32
// and which the tests use as the reference.
//
// `t` is the storage dtype of activations, parameters and their gradients (kF32, kF16 or kBF16);
// arithmetic is fp32. Statistics (mean, rstd, lse, losses, norms) are fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/adam.h"
#include "core/dtype.h"

namespace zo::gpu {

// ---- embedding (embedding.cu) ------------------------------------------------------------------
// out (B,T,C) written = wte[tokens[b,t]] + wpe[t]
void launch_embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                              const void* wpe, int B, int T, int C, DType t, cudaStream_t s);
// dwte (V,C) +=, dwpe (T,C) += from dout (B,T,C). Deterministic (no float atomics).
void launch_embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                               int B, int T, int C, DType t, cudaStream_t s);

// ---- layernorm (layernorm.cu), eps 1e-5 --------------------------------------------------------
void launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                              const void* weight, const void* bias, int N, int C, DType t,
                              cudaStream_t s);
// dinp (N,C) +=, dweight, dbias (C) +=. Deterministic.
void launch_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, const float* mean,
                               const float* rstd, int N, int C, DType t, cudaStream_t s);

// ---- elementwise (elementwise.cu)
// ----------------------------------------------------------------
void launch_gelu_forward(void* out, const void* inp, std::size_t n, DType t, cudaStream_t s);
void launch_gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType t,
                          cudaStream_t s);  // dinp +=
void launch_residual_forward(void* out, const void* a, const void* b, std::size_t n, DType t,
                             cudaStream_t s);
void launch_accumulate(void* dst, const void* src, std::size_t n, DType t, cudaStream_t s);

// ---- matmul through cuBLASLt (matmul.cpp)
// --------------------------------------------------------- out (N,OC) written = inp (N,C) @ weight
// (OC,C)^T + bias (OC, may be null); fp32 accumulation. `workspace` is a per-stream cuBLASLt
// workspace (see MatmulContext).
struct MatmulContext;  // cuBLASLt handle + workspace, one per device; create_matmul_context()
MatmulContext* create_matmul_context();
void destroy_matmul_context(MatmulContext* ctx) noexcept;
void launch_matmul_forward(MatmulContext* ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, DType t, cudaStream_t s);
// dinp (N,C) +=; dweight (OC,C) +=; dbias (OC) += (skipped when null).
void launch_matmul_backward(MatmulContext* ctx, void* dinp, void* dweight, void* dbias,
                            const void* dout, const void* inp, const void* weight, int N, int C,
                            int OC, DType t, cudaStream_t s);

// ---- attention (attention.cu): causal, flash-style, never materialises (B,NH,T,T) -------------
// qkv (B,T,3C) as [q | k | v]; out (B,T,C) written; lse (B,NH,T) fp32 written (natural log of
// the row sums of exp(score) with score = q.k / sqrt(hs)).
void launch_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                              DType t, cudaStream_t s);
// dqkv (B,T,3C) +=. `scratch` holds B*NH*T floats (D = rowsum(dout * out)).
void launch_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, float* scratch, int B, int T, int C, int NH,
                               DType t, cudaStream_t s);

// ---- loss and reductions (cross_entropy.cu, reduce.cu) ----------------------------------------
// losses (N) fp32 written; dlogits (may alias logits or be null) written with
// dloss_scale * (softmax - onehot).
void launch_cross_entropy(float* losses, void* dlogits, const void* logits,
                          const std::int32_t* targets, int N, int V, float dloss_scale, DType t,
                          cudaStream_t s);
// *out += sum of squares of data (n); deterministic (fixed grid, fixed-order final reduction).
void launch_sum_squares(float* out, const void* data, std::size_t n, DType t, cudaStream_t s);
// *flag = 1 if any element is Inf/NaN (left unchanged otherwise).
void launch_nonfinite_flag(float* flag, const void* data, std::size_t n, DType t, cudaStream_t s);

// ---- AdamW for the GPU-resident mode (adamw.cu) -----------------------------------------------
// The same math as cpu_adam (core/adam.h, docs/cpu_adam.md): fp32 master/m/v on the device, grads
// (n, gt) times grad_mult; params_out (n, pt) written with the new params when non-null. Update
// number t; decoupled weight decay only.
void launch_adamw(float* master, float* m, float* v, const void* grads, DType gt, void* params_out,
                  DType pt, std::size_t n, const AdamConfig& c, std::int64_t t, float grad_mult,
                  cudaStream_t s);

}  // namespace zo::gpu
