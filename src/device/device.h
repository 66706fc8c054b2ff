// The op-level device interface the GPT model is written against (docs/training.md, "The device
// interface"). Two backends implement it: the host backend (fp32, Eigen, worker-thread streams;
// src/device/host_*) and the CUDA backend (gpu/, adapted by src/device/cuda_device.cpp). Every op
// is enqueued on a stream and runs asynchronously with respect to the caller; ordering between
// streams is expressed with events, exactly as in CUDA.
//
// Conventions for every op:
// - Pointers are device memory from Device::alloc; activations and parameters are in
//   act_dtype() (fp32 on the host backend, fp16/bf16 on CUDA); statistics (layernorm mean/rstd,
//   attention log-sum-exp, losses) are always fp32.
// - Parameter gradients are accumulated (+=), so micro-batches and shared weights (tied
//   embedding) add up. Activation gradients are written (the matmul's dinp: a GEMM with beta = 0
//   needs no zero-filled buffer and does not read one) where the model consumes each once, and
//   accumulated only where it sums several (layernorm_backward's residual); each op's comment
//   says which.
// - Shapes are in the comment next to each pointer; B batch, T sequence, C channels, NH heads,
//   V vocabulary, OC output channels, N = B*T rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/adam.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zo::dev {

enum class Backend { kHost, kCuda };

class Device;

// RAII, move-only device allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device* device, void* data, std::size_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  void reset() noexcept;

 private:
  Device* device_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// An ordered queue of work. Ops enqueued on one stream run in order; different streams overlap.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual void synchronize() = 0;  // blocks the caller until all enqueued work is done
  // The backend's own stream object, for a library that enqueues work on it (NCCL collectives,
  // src/comm/stream_comm.cpp): the cudaStream_t of a CUDA stream; nullptr on the host backend,
  // whose streams are threads.
  virtual void* native_handle() { return nullptr; }
};

// For destructors and unwinding: waits for s and swallows its error, which whoever enqueued the
// failing op reports.
void synchronize_quietly(Stream& s) noexcept;

// Waits for a stream when it goes out of scope, on every way out: work still queued that uses
// buffers declared before it finishes before they are freed.
class StreamDrain {
 public:
  explicit StreamDrain(Stream& s) noexcept : s_(s) {}
  ~StreamDrain() { synchronize_quietly(s_); }
  StreamDrain(const StreamDrain&) = delete;
  StreamDrain& operator=(const StreamDrain&) = delete;

 private:
  Stream& s_;
};

// A marker recorded on a stream; other streams (or the host) can wait for it.
class Event {
 public:
  virtual ~Event() = default;
  virtual void synchronize() = 0;  // blocks until the recorded work is done
  virtual bool query() = 0;        // true if done (or never recorded)
  // Milliseconds between two completed events on the same device (for traces and timings).
  virtual double elapsed_ms_since(Event& start) = 0;
};

// One stream's work recorded once and replayed as one launch (Device::capture; CUDA Graphs,
// docs/gpu.md). The work replays with the arguments it had when recorded.
class Graph {
 public:
  virtual ~Graph() = default;
  // Replays the work on the stream it was captured on. False, with nothing enqueued, when the
  // recording is stale (the stream's scratch moved since): capture it again.
  virtual bool launch() = 0;
};

// ---- op parameters --------------------------------------------------------------------------
struct MatmulArgs {  // out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC)
  int N, C, OC;
  // Row stride (elements, >= OC) of out in the forward and of dout in the backward; 0: OC. The
  // columns past OC are neither read nor written. The LM head pads its logits rows to
  // gemm_row_stride(V) (model/gpt.h).
  int ld_out = 0;
};

// Columns the CUDA backend rounds a padded row up to a multiple of (Device::gemm_row_stride).
inline constexpr int kGemmRowAlign = 128;
// Causal self-attention over a fused qkv buffer, multi-head or grouped-query (GQA, arXiv
// 2305.13245): NH query heads share NKV key/value heads, query head h reading kv head
// h / (NH / NKV). hs = head_size(); qkv (B, T, (NH + 2 NKV) hs) per token as
// [q (NH hs) | k (NKV hs) | v (NKV hs)], head h of each part at columns [h hs, (h+1) hs) of it:
// what one matmul with the q, k and v projections stacked row-wise writes. out (B, T, NH hs).
// With NKV = NH and hs = C / NH (GPT-2) that is qkv (B, T, 3C) and out (B, T, C).
struct AttentionArgs {
  int B, T, C, NH;  // C: the model's channels, read only to derive hs when HS is 0
  int NKV = 0;      // key/value heads, a divisor of NH; 0: NH (multi-head attention)
  int HS = 0;       // head size; 0: C / NH
  int pos0 = 0;     // rope_forward/backward: the position of each sequence's first row

  int kv_heads() const { return NKV != 0 ? NKV : NH; }
  int head_size() const { return HS != 0 ? HS : C / NH; }
  int qkv_width() const { return (NH + 2 * kv_heads()) * head_size(); }  // qkv's row length
  int out_width() const { return NH * head_size(); }                     // out's row length
};

// The checks every backend's adamw makes (hyperparameters, step, AdamW only); throws
// std::invalid_argument naming `op` and the bad value.
void check_adamw_args(const char* op, const AdamConfig& c, std::int64_t t, float grad_mult);

class Device {
 public:
  virtual ~Device() = default;

  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;
  virtual DType act_dtype() const = 0;
  // The CUDA runtime ordinal (for NUMA placement of pinned staging near the GPU); -1 on the host.
  virtual int cuda_ordinal() const { return -1; }
  // The row stride (elements) to give an activation of `cols` columns that GEMMs take as a
  // leading dimension (the logits): `cols` on the host backend, whose results stay as they were
  // and whose logits the sampler reads packed; on CUDA rounded up to kGemmRowAlign, so that every
  // row starts 16-byte aligned (256 B in 16-bit storage) and cuBLASLt can use its TMA / tensor-core
  // kernels, which an odd stride like GPT-2's 50257 rules out.
  virtual int gemm_row_stride(int cols) const { return cols; }
  // The GEMM algorithms chosen by timing, as text a checkpoint keeps (CUDA: gpu/ops.h's
  // export_matmul_choices; "" on the host backend, which has one algorithm). Restoring another
  // process's makes the same choices, so a resumed run computes the uninterrupted run's bits;
  // returns "" when taken, else why not (another GPU or library version), and throws
  // std::invalid_argument for text that is no such export.
  virtual std::string gemm_choices() const { return {}; }
  virtual std::string restore_gemm_choices(const std::string&) {
    return "this backend does not choose between GEMM algorithms";
  }

  // ---- memory -------------------------------------------------------------------------------
  // Throws OutOfMemoryError naming `what` when the capacity would be exceeded.
  virtual Buffer alloc(std::size_t bytes, const char* what) = 0;
  virtual std::size_t capacity_bytes() const = 0;
  virtual std::size_t used_bytes() const = 0;

  // ---- streams, events, copies ----------------------------------------------------------------
  // high_priority: work on it goes before work of normal streams where the backend can order
  // them (the offload engine's copy streams; ignored by the host backend).
  virtual std::unique_ptr<Stream> create_stream(bool high_priority = false) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual void record(Event& e, Stream& s) = 0;  // e completes when work enqueued so far on s does
  virtual void wait(Stream& s, Event& e) = 0;    // later work on s waits for e
  // Host memory must stay valid until the copy completes (synchronize or wait on an event).
  virtual void copy_to_device(void* dst, const void* host_src, std::size_t bytes, Stream& s) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes, Stream& s) = 0;
  virtual void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream& s) = 0;
  virtual void fill_zero(void* dst, std::size_t bytes, Stream& s) = 0;

  // ---- graphs (CUDA Graphs; the host backend has none) -----------------------------------------
  // Whether capture works here: CUDA, unless ZO_SYNC_EACH_OP waits after every op.
  virtual bool can_capture() const { return false; }
  // Records what `work` enqueues on s (it must enqueue on s alone and must have run once on s
  // before: lazy setup cannot be recorded) without running it. Throws when the work did what a
  // recording cannot hold (a synchronisation, an allocation, a pageable copy); s records no more.
  virtual std::unique_ptr<Graph> capture(Stream& s, const std::function<void()>& work);

  // ---- GPT ops ----------------------------------------------------------------------------------
  // out (B,T,C) written = wte[tokens] + wpe[t]; tokens (B,T) int32 device memory, wte (V,C), wpe
  // (T,C), or null for a model without learned positions (Llama: wte[tokens] alone)
  virtual void embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                                 const void* wpe, int B, int T, int C, Stream& s) = 0;
  // dwte (V,C) +=, dwpe (T,C) += from dout (B,T,C); dwpe null: none
  virtual void embedding_backward(void* dwte, void* dwpe, const void* dout,
                                  const std::int32_t* tokens, int B, int T, int C, Stream& s) = 0;

  // out (N,C) written; mean, rstd (N) fp32 written; weight, bias (C); eps 1e-5 as GPT-2
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                 const void* weight, const void* bias, int N, int C, Stream& s) = 0;
  // The residual add and the LayerNorm after it, fused: res (N,C) written = a + b, then
  // layernorm_forward(out, mean, rstd, res, ...), with exactly the results of those two ops.
  virtual void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd,
                                          const void* a, const void* b, const void* weight,
                                          const void* bias, int N, int C, Stream& s) = 0;
  // dinp (N,C) written = dresidual + d(LN)/d(inp); dweight, dbias (C) +=. dresidual (N,C) may be
  // null (nothing to add) or dinp itself: the residual stream's gradient, accumulated in place
  // (the backward of residual_layernorm_forward, whose res feeds the next residual add too).
  virtual void layernorm_backward(void* dinp, const void* dresidual, void* dweight, void* dbias,
                                  const void* dout, const void* inp, const void* weight,
                                  const float* mean, const float* rstd, int N, int C,
                                  Stream& s) = 0;

  // out (N,OC; row stride a.ld_out) written; bias may be null
  virtual void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                              const MatmulArgs& a, Stream& s) = 0;
  // The MLP's first layer: pre (N,OC) written = inp @ weight^T + bias (kept for the backward), out
  // (N,OC) written = gelu(pre) (cuBLASLt's GELU_AUX_BIAS epilogue on CUDA). Packed rows
  // (a.ld_out 0 or OC).
  virtual void matmul_gelu_forward(void* out, void* pre, const void* inp, const void* weight,
                                   const void* bias, const MatmulArgs& a, Stream& s) = 0;
  // dinp (N,C) written; dweight (OC,C) +=; dbias (OC) += (skipped when null); dout row stride
  // a.ld_out.
  virtual void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, const MatmulArgs& a,
                               Stream& s) = 0;
  // matmul_backward for inp = gelu(pre): dpre (N,C) written = gelu'(pre) * (dout @ weight) in place
  // of dinp (the DGELU epilogue on CUDA); pre (N,C). Packed rows (a.ld_out 0 or OC).
  virtual void matmul_dgelu_backward(void* dpre, void* dweight, void* dbias, const void* dout,
                                     const void* inp, const void* weight, const void* pre,
                                     const MatmulArgs& a, Stream& s) = 0;

  // out (N) written = gelu(inp), tanh approximation (GPT-2)
  virtual void gelu_forward(void* out, const void* inp, std::size_t n, Stream& s) = 0;
  // dinp (N) += gelu'(inp) * dout
  virtual void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n,
                             Stream& s) = 0;

  // out (N) written = a + b
  virtual void residual_forward(void* out, const void* a, const void* b, std::size_t n,
                                Stream& s) = 0;
  // dst (N) += src
  virtual void accumulate(void* dst, const void* src, std::size_t n, Stream& s) = 0;
  // dst (N, fp32) += src (N, act dtype): gradients summed over micro-batches in fp32
  virtual void accumulate_f32(float* dst, const void* src, std::size_t n, Stream& s) = 0;

  // Causal self-attention, shapes in AttentionArgs: qkv (B, T, qkv_width), out (B, T, out_width)
  // written; lse (B,NH,T) fp32 written: per-row log-sum-exp of the scaled scores (q.k / sqrt(hs)),
  // kept for the backward pass instead of the (B,NH,T,T) probability matrix.
  virtual void attention_forward(void* out, float* lse, const void* qkv, const AttentionArgs& a,
                                 Stream& s) = 0;
  // dqkv (B, T, qkv_width) written, every element once; dk, dv of a kv head sum over the
  // NH / NKV query heads sharing it, in a fixed order.
  virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* lse, const AttentionArgs& a, Stream& s) = 0;

  // One step of incremental decoding with a KV cache: per sequence b, the query of position pos
  // (0 <= pos < a.T) attends to the keys and values of positions [0, pos] (causal by
  // construction) of qkv (B, T, qkv_width), the cache: a forward over the prompt fills its rows,
  // each decode step writes row pos before this runs; rows past pos are not read. out (B,
  // out_width) written. No lse: nothing goes backward through a decode step.
  virtual void attention_decode(void* out, const void* qkv, int pos, const AttentionArgs& a,
                                Stream& s) = 0;

  // ---- Llama-family ops ---------------------------------------------------------------------
  // RMSNorm (arXiv 1910.07467), no bias: out (N,C) written = inp * rstd * weight; rstd (N) fp32
  // written = 1 / sqrt(mean(inp^2) + eps); weight (C). Llama uses eps = rms_norm_eps (1e-5).
  virtual void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N,
                               int C, float eps, Stream& s) = 0;
  // dinp (N,C) written = dresidual + d(RMSNorm)/d(inp); dweight (C) +=. dresidual as in
  // layernorm_backward: null (nothing to add), dinp itself (accumulated in place) or separate.
  virtual void rmsnorm_backward(void* dinp, const void* dresidual, void* dweight, const void* dout,
                                const void* inp, const void* weight, const float* rstd, int N,
                                int C, Stream& s) = 0;

  // Rotary position embedding (RoFormer, arXiv 2104.09864) in Hugging Face's rotate_half layout:
  // in each q and k head of qkv (the layout of AttentionArgs), the pair (x_i, x_{i+hs/2}) of token
  // t, i < hs/2, becomes (x_i cos - x_{i+hs/2} sin, x_{i+hs/2} cos + x_i sin) with angle
  // t * inv_freq[i] (t = a.pos0 .. a.pos0 + T-1 in each sequence: a decode step rotates its one
  // row at its position), in place; v is left alone. inv_freq (hs/2)
  // fp32 (model/rope.h); the angle, cos and sin are fp32, as Hugging Face computes them. hs even.
  virtual void rope_forward(void* qkv, const float* inv_freq, const AttentionArgs& a,
                            Stream& s) = 0;
  // The transpose rotation of the dq and dk parts of dqkv (B, T, qkv_width), in place: run after
  // attention_backward, it turns the gradient of the rotated q, k into that of the unrotated.
  virtual void rope_backward(void* dqkv, const float* inv_freq, const AttentionArgs& a,
                             Stream& s) = 0;

  // SwiGLU (arXiv 2002.05202): out (N,I) written = silu(gate) * up, silu(x) = x sigmoid(x).
  // gate_up (N, 2I) per row as [gate (I) | up (I)]: one matmul with Llama's gate_proj and
  // up_proj weights stacked row-wise writes it.
  virtual void swiglu_forward(void* out, const void* gate_up, int N, int I, Stream& s) = 0;
  // dgate_up (N, 2I) written = [dout * up * silu'(gate) | dout * silu(gate)]; it may be gate_up
  // itself (each row is read before it is written).
  virtual void swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, int N, int I,
                               Stream& s) = 0;

  // Softmax cross-entropy over V classes per row. logits (N,V), rows ld >= V elements apart (the
  // columns past V are neither read nor written); targets (N) int32. losses (N) fp32 written.
  // When dlogits is non-null it is written (same row stride; may alias logits) with
  // dloss_scale * (softmax - onehot): the gradient of dloss_scale * sum(losses).
  virtual void cross_entropy(float* losses, void* dlogits, const void* logits,
                             const std::int32_t* targets, int N, int V, int ld, float dloss_scale,
                             Stream& s) = 0;

  // *out (fp32, device) += sum of squares of data (n, act_dtype); for the global grad norm.
  virtual void sum_squares(float* out, const void* data, std::size_t n, Stream& s) = 0;
  // *flag (fp32, device) set to 1 if any element of data (n) is Inf/NaN (left as is otherwise).
  virtual void nonfinite_flag(float* flag, const void* data, std::size_t n, Stream& s) = 0;
  // *gate (device) = step_gate(*sumsq, rule) (core/adam.h) from the squared gradient norm at
  // sumsq (one fp32, device): the update decided on the device, for an adamw enqueued before
  // the host has read the norm.
  virtual void step_gate(StepGate* gate, const float* sumsq, const StepGateRule& rule,
                         Stream& s) = 0;
  // Elementwise conversion; either side may be act_dtype() or fp32.
  virtual void cast(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n,
                    Stream& s) = 0;

  // AdamW update number t on the device for the GPU-resident mode, with the math of cpu_adam
  // (core/adam.h): master, m, v (n) fp32 device arrays updated in place from grads (n, act
  // dtype) times grad_mult; params_out (n, act dtype) written with the new parameters (may be
  // null; on the host backend, whose act dtype is fp32, it may equal master). Decoupled weight
  // decay only (c.decoupled_weight_decay). With a run table (run_starts: num_runs >= 1 entries
  // in device memory, 8-byte aligned, core/adam.h's format, from 0 ascending below n)
  // c.weight_decay applies only in the runs marked for it, so that one launch updates a whole
  // layout; with null, to every element. With a gate (device memory, written by step_gate) its
  // multiplier replaces grad_mult, and when it says skip nothing is written.
  virtual void adamw(float* master, float* m, float* v, const void* grads, void* params_out,
                     std::size_t n, const AdamConfig& c, std::int64_t t, float grad_mult,
                     const std::uint64_t* run_starts, int num_runs, const StepGate* gate,
                     Stream& s) = 0;

 protected:
  friend class Buffer;
  virtual void release(void* data, std::size_t bytes) noexcept = 0;
};

struct HostDeviceOptions {
  std::size_t capacity_bytes = 0;  // 0: unlimited (host RAM)
  int threads = 0;                 // compute threads for ops; 0: all cores
};
std::unique_ptr<Device> make_host_device(const HostDeviceOptions& options);

}  // namespace zo::dev
