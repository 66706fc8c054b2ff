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
//   embedding) add up; activation gradients named `dinp` are accumulated too unless the op's
//   comment says "written".
// - Shapes are in the comment next to each pointer; B batch, T sequence, C channels, NH heads,
//   V vocabulary, OC output channels, N = B*T rows.
#pragma once

#include <cstddef>
#include <cstdint>
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

// A marker recorded on a stream; other streams (or the host) can wait for it.
class Event {
 public:
  virtual ~Event() = default;
  virtual void synchronize() = 0;  // blocks until the recorded work is done
  virtual bool query() = 0;        // true if done (or never recorded)
  // Milliseconds between two completed events on the same device (for traces and timings).
  virtual double elapsed_ms_since(Event& start) = 0;
};

// ---- op parameters --------------------------------------------------------------------------
struct MatmulArgs {  // out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC)
  int N, C, OC;
};
struct AttentionArgs {
  int B, T, C, NH;  // head size C / NH; causal
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

  // ---- GPT ops ----------------------------------------------------------------------------------
  // out (B,T,C) written = wte[tokens] + wpe[t]; tokens (B,T) int32 device memory, wte (V,C), wpe
  // (T,C)
  virtual void embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                                 const void* wpe, int B, int T, int C, Stream& s) = 0;
  // dwte (V,C) +=, dwpe (T,C) += from dout (B,T,C)
  virtual void embedding_backward(void* dwte, void* dwpe, const void* dout,
                                  const std::int32_t* tokens, int B, int T, int C, Stream& s) = 0;

  // out (N,C) written; mean, rstd (N) fp32 written; weight, bias (C); eps 1e-5 as GPT-2
  virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                 const void* weight, const void* bias, int N, int C, Stream& s) = 0;
  // dinp (N,C) +=, dweight, dbias (C) +=
  virtual void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                                  const void* inp, const void* weight, const float* mean,
                                  const float* rstd, int N, int C, Stream& s) = 0;

  // out (N,OC) written; bias may be null
  virtual void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                              const MatmulArgs& a, Stream& s) = 0;
  // dinp (N,C) +=; dweight (OC,C) +=; dbias (OC) += (skipped when null)
  virtual void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, const MatmulArgs& a,
                               Stream& s) = 0;

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

  // Causal self-attention. qkv (B,T,3C) as [q | k | v], head h uses channels [h*hs, (h+1)*hs).
  // out (B,T,C) written; lse (B,NH,T) fp32 written: per-row log-sum-exp of the scaled scores,
  // kept for the backward pass instead of the (B,NH,T,T) probability matrix.
  virtual void attention_forward(void* out, float* lse, const void* qkv, const AttentionArgs& a,
                                 Stream& s) = 0;
  // dqkv (B,T,3C) +=
  virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* lse, const AttentionArgs& a, Stream& s) = 0;

  // Softmax cross-entropy over V classes per row. logits (N,V); targets (N) int32.
  // losses (N) fp32 written. When dlogits is non-null it is written (may alias logits) with
  // dloss_scale * (softmax - onehot): the gradient of dloss_scale * sum(losses).
  virtual void cross_entropy(float* losses, void* dlogits, const void* logits,
                             const std::int32_t* targets, int N, int V, float dloss_scale,
                             Stream& s) = 0;

  // *out (fp32, device) += sum of squares of data (n, act_dtype); for the global grad norm.
  virtual void sum_squares(float* out, const void* data, std::size_t n, Stream& s) = 0;
  // *flag (fp32, device) set to 1 if any element of data (n) is Inf/NaN (left as is otherwise).
  virtual void nonfinite_flag(float* flag, const void* data, std::size_t n, Stream& s) = 0;
  // Elementwise conversion; either side may be act_dtype() or fp32.
  virtual void cast(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n,
                    Stream& s) = 0;

  // AdamW update number t on the device for the GPU-resident mode, with the math of cpu_adam
  // (core/adam.h): master, m, v (n) fp32 device arrays updated in place from grads (n, act
  // dtype) times grad_mult; params_out (n, act dtype) written with the new parameters (may be
  // null; on the host backend, whose act dtype is fp32, it may equal master). Decoupled weight
  // decay only (c.decoupled_weight_decay).
  virtual void adamw(float* master, float* m, float* v, const void* grads, void* params_out,
                     std::size_t n, const AdamConfig& c, std::int64_t t, float grad_mult,
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
