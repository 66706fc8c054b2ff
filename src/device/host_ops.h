// The host backend's ops as plain synchronous functions on fp32 host arrays. HostDevice
// validates arguments and enqueues these on a stream; they run inside the stream's task on a
// oneTBB arena. Every op splits its work into blocks fixed by the shapes alone, never by the
// thread count, and each output (or partial sum) is computed by exactly one block in a fixed
// order, so results are bit-identical for any number of threads. Semantics and shapes are those
// of the matching Device ops in device.h.
#pragma once

#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace zo::dev::host {

using Arena = tbb::task_arena;

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2 / PyTorch default

// Data the enqueuing call cannot see is checked here: a negative token id (the embedding ops
// are not told V) or a target outside [0, V) throws std::out_of_range, which the stream
// rethrows at synchronize().
void embedding_forward(Arena& arena, float* out, const std::int32_t* tokens, const float* wte,
                       const float* wpe, int B, int T, int C);
void embedding_backward(Arena& arena, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, int B, int T, int C);

void layernorm_forward(Arena& arena, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_backward(Arena& arena, float* dinp, const float* dresidual, float* dweight,
                        float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, int N, int C);

// ld: the row stride of out / dout (>= OC). The fused Device ops (matmul_gelu_forward,
// matmul_dgelu_backward, residual_layernorm_forward) are these functions in sequence, so they
// give exactly the unfused sequence's results.
void matmul_forward(Arena& arena, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC, int ld);
void matmul_backward(Arena& arena, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC, int ld);

void gelu_forward(Arena& arena, float* out, const float* inp, std::size_t n);
void gelu_backward(Arena& arena, float* dinp, const float* inp, const float* dout, std::size_t n);
// d = gelu'(pre) * d: gelu_backward into a zeroed dinp, without the zeros.
void gelu_grad_in_place(Arena& arena, float* d, const float* pre, std::size_t n);
void residual_forward(Arena& arena, float* out, const float* a, const float* b, std::size_t n);
void accumulate(Arena& arena, float* dst, const float* src, std::size_t n);

// NKV key/value heads (grouped-query when < NH), head size hs: the layout of dev::AttentionArgs.
void attention_forward(Arena& arena, float* out, float* lse, const float* qkv, int B, int T, int NH,
                       int NKV, int hs);
void attention_backward(Arena& arena, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int NH, int NKV, int hs);
// The query of position pos against keys and values [0, pos] of qkv (B, T, ...); out (B, NH hs).
void attention_decode(Arena& arena, float* out, const float* qkv, int B, int T, int NH, int NKV,
                      int hs, int pos);

// The Llama-family ops (host_ops_llama.cpp).
void rmsnorm_forward(Arena& arena, float* out, float* rstd, const float* inp, const float* weight,
                     int N, int C, float eps);
void rmsnorm_backward(Arena& arena, float* dinp, const float* dresidual, float* dweight,
                      const float* dout, const float* inp, const float* weight, const float* rstd,
                      int N, int C);
// kInverse: the transpose rotation (the backward). Rotates the NH + NKV q and k heads of each
// token of qkv (B, T, (NH + 2 NKV) hs) in place; row t of a sequence is at position pos0 + t.
void rope(Arena& arena, float* qkv, const float* inv_freq, int B, int T, int NH, int NKV, int hs,
          int pos0, bool inverse);
void swiglu_forward(Arena& arena, float* out, const float* gate_up, int N, int I);
void swiglu_backward(Arena& arena, float* dgate_up, const float* dout, const float* gate_up, int N,
                     int I);

void cross_entropy(Arena& arena, float* losses, float* dlogits, const float* logits,
                   const std::int32_t* targets, int N, int V, int ld, float dloss_scale);

void sum_squares(Arena& arena, float* out, const float* data, std::size_t n);
void nonfinite_flag(Arena& arena, float* flag, const float* data, std::size_t n);
void cast(Arena& arena, void* dst, DType dst_t, const void* src, DType src_t, std::size_t n);

}  // namespace zo::dev::host
