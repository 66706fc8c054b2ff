// The CUDA backend of zo::dev::Device: forwards every call to gpu/'s public API (gpu/runtime.h
// for memory, streams, events and copies; gpu/ops.h for the ops, which check their own
// arguments). What stays here is what only the adapter knows: that a dev::Stream or dev::Event
// came from a CUDA device, the activation dtype, and the ZO_SYNC_EACH_OP check after each op.
#ifdef ZO_HAVE_CUDA

#include "device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpu/device.h"
#include "gpu/graph.h"
#include "gpu/ops.h"
#include "gpu/runtime.h"

namespace zo::dev {
namespace {

[[noreturn]] void bad_arg(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("cuda device: ") + op + ": " + what);
}

class CudaStream final : public Stream {
 public:
  explicit CudaStream(gpu::Stream s) : s_(std::move(s)) {}
  void synchronize() override { s_.synchronize(); }
  void* native_handle() override { return s_.get(); }
  gpu::Stream s_;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : e_(device) {}
  void synchronize() override { e_.synchronize(); }
  bool query() override { return e_.query(); }
  double elapsed_ms_since(Event& start) override;
  gpu::Event e_;
};

class CudaGraph final : public Graph {
 public:
  explicit CudaGraph(gpu::Graph g) : g_(std::move(g)) {}
  bool launch() override {
    if (!g_.current()) return false;
    g_.launch();
    return true;
  }
  gpu::Graph g_;
};

gpu::Stream& cuda_stream(Stream& s, const char* op) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  if (cs == nullptr) bad_arg(op, "the stream was not created by a CUDA device");
  return cs->s_;
}
gpu::Event& cuda_event(Event& e, const char* op) {
  auto* ce = dynamic_cast<CudaEvent*>(&e);
  if (ce == nullptr) bad_arg(op, "the event was not created by a CUDA device");
  return ce->e_;
}

double CudaEvent::elapsed_ms_since(Event& start) {
  return e_.elapsed_ms_since(cuda_event(start, "elapsed_ms_since"));
}

struct MatmulContextDeleter {
  void operator()(gpu::MatmulContext* ctx) const noexcept { gpu::destroy_matmul_context(ctx); }
};

bool valid_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(const CudaDeviceOptions& o, const gpu::DeviceInfo& info)
      : index_(info.index), act_(o.act_dtype), sync_each_op_(gpu::sync_each_op_requested()) {
    const gpu::DeviceGuard guard(index_);
    name_ = "cuda:" + std::to_string(index_) + " " + info.name + " (" +
            std::string(dtype_name(act_)) + ")";
    matmul_.reset(gpu::create_matmul_context());
    pool_ = gpu::MemoryPool::open(index_, o.capacity_bytes);  // after the matmul workspace
  }
  ~CudaDevice() override {
    const gpu::QuietDeviceGuard guard(index_);
    matmul_.reset();  // waits for queued GEMMs before freeing their workspace
  }

  Backend backend() const override { return Backend::kCuda; }
  std::string name() const override { return name_; }
  int cuda_ordinal() const override { return index_; }
  int gemm_row_stride(int cols) const override {
    return (cols + kGemmRowAlign - 1) / kGemmRowAlign * kGemmRowAlign;
  }
  std::string gemm_choices() const override {
    const gpu::DeviceGuard guard(index_);
    return gpu::export_matmul_choices(matmul_.get());
  }
  std::string restore_gemm_choices(const std::string& text) override {
    const gpu::DeviceGuard guard(index_);
    return gpu::import_matmul_choices(matmul_.get(), text);
  }
  DType act_dtype() const override { return act_; }

  Buffer alloc(std::size_t bytes, const char* what) override {
    return Buffer(this, pool_->allocate(bytes, what != nullptr ? what : "(unnamed buffer)"), bytes);
  }
  std::size_t capacity_bytes() const override { return pool_->capacity(); }
  std::size_t used_bytes() const override { return pool_->in_use(); }

  std::unique_ptr<Stream> create_stream(bool high_priority) override {
    return std::make_unique<CudaStream>(gpu::Stream(index_, pool_, high_priority));
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(index_); }
  void record(Event& e, Stream& s) override {
    cuda_event(e, "record").record(cuda_stream(s, "record"));
  }
  void wait(Stream& s, Event& e) override { cuda_stream(s, "wait").wait(cuda_event(e, "wait")); }

  bool can_capture() const override { return !sync_each_op_; }
  std::unique_ptr<Graph> capture(Stream& s, const std::function<void()>& work) override {
    if (sync_each_op_) return Device::capture(s, work);  // throws
    return std::make_unique<CudaGraph>(gpu::Graph::capture(cuda_stream(s, "capture"), work));
  }

  void copy_to_device(void* dst, const void* host_src, std::size_t bytes, Stream& s) override {
    copy("copy_to_device", dst, host_src, bytes, cudaMemcpyHostToDevice, s);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes, Stream& s) override {
    copy("copy_to_host", host_dst, src, bytes, cudaMemcpyDeviceToHost, s);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    copy("copy_on_device", dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  }
  void fill_zero(void* dst, std::size_t bytes, Stream& s) override {
    run(s, "fill_zero", [&](gpu::Stream& cs) { cs.fill_zero(dst, bytes); });
  }

  // ---- GPT ops: one launcher each (gpu/ops.h) -------------------------------------------------
  void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe,
                         int B, int T, int C, Stream& s) override {
    launch(s, "embedding_forward", [&](cudaStream_t cs) {
      gpu::launch_embedding_forward(out, tokens, wte, wpe, B, T, C, act_, cs);
    });
  }
  void embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                          int B, int T, int C, Stream& s) override {
    launch_with_scratch(s, "embedding_backward", gpu::embedding_backward_scratch_bytes(B, T),
                        [&](cudaStream_t cs, void* scratch) {
                          gpu::launch_embedding_backward(dwte, dwpe, dout, tokens, B, T, C, act_,
                                                         scratch, cs);
                        });
  }
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C, Stream& s) override {
    launch(s, "layernorm_forward", [&](cudaStream_t cs) {
      gpu::launch_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, act_, cs);
    });
  }
  void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a,
                                  const void* b, const void* weight, const void* bias, int N, int C,
                                  Stream& s) override {
    launch(s, "residual_layernorm_forward", [&](cudaStream_t cs) {
      gpu::launch_residual_layernorm_forward(res, out, mean, rstd, a, b, weight, bias, N, C, act_,
                                             cs);
    });
  }
  void layernorm_backward(void* dinp, const void* dresidual, void* dweight, void* dbias,
                          const void* dout, const void* inp, const void* weight, const float* mean,
                          const float* rstd, int N, int C, Stream& s) override {
    launch_with_scratch(s, "layernorm_backward", gpu::layernorm_backward_scratch_bytes(N, C),
                        [&](cudaStream_t cs, void* scratch) {
                          gpu::launch_layernorm_backward(dinp, dresidual, dweight, dbias, dout, inp,
                                                         weight, mean, rstd, N, C, act_, scratch,
                                                         cs);
                        });
  }
  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                      const MatmulArgs& m, Stream& s) override {
    launch(s, "matmul_forward", [&](cudaStream_t cs) {
      gpu::launch_matmul_forward(matmul_.get(), out, inp, weight, bias, m.N, m.C, m.OC, m.ld_out,
                                 act_, cs);
    });
  }
  void matmul_gelu_forward(void* out, void* pre, const void* inp, const void* weight,
                           const void* bias, const MatmulArgs& m, Stream& s) override {
    launch(s, "matmul_gelu_forward", [&](cudaStream_t cs) {
      require_packed("matmul_gelu_forward", m);
      gpu::launch_matmul_gelu_forward(matmul_.get(), out, pre, inp, weight, bias, m.N, m.C, m.OC,
                                      act_, cs);
    });
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, const MatmulArgs& m, Stream& s) override {
    launch(s, "matmul_backward", [&](cudaStream_t cs) {
      gpu::launch_matmul_backward(matmul_.get(), dinp, dweight, dbias, dout, inp, weight, m.N, m.C,
                                  m.OC, m.ld_out, act_, cs);
    });
  }
  void matmul_dgelu_backward(void* dpre, void* dweight, void* dbias, const void* dout,
                             const void* inp, const void* weight, const void* pre,
                             const MatmulArgs& m, Stream& s) override {
    launch(s, "matmul_dgelu_backward", [&](cudaStream_t cs) {
      require_packed("matmul_dgelu_backward", m);
      gpu::launch_matmul_dgelu_backward(matmul_.get(), dpre, dweight, dbias, dout, inp, weight, pre,
                                        m.N, m.C, m.OC, act_, cs);
    });
  }
  void gelu_forward(void* out, const void* inp, std::size_t n, Stream& s) override {
    launch(s, "gelu_forward",
           [&](cudaStream_t cs) { gpu::launch_gelu_forward(out, inp, n, act_, cs); });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n,
                     Stream& s) override {
    launch(s, "gelu_backward",
           [&](cudaStream_t cs) { gpu::launch_gelu_backward(dinp, inp, dout, n, act_, cs); });
  }
  void residual_forward(void* out, const void* a, const void* b, std::size_t n,
                        Stream& s) override {
    launch(s, "residual_forward",
           [&](cudaStream_t cs) { gpu::launch_residual_forward(out, a, b, n, act_, cs); });
  }
  void accumulate(void* dst, const void* src, std::size_t n, Stream& s) override {
    launch(s, "accumulate",
           [&](cudaStream_t cs) { gpu::launch_accumulate(dst, src, n, act_, cs); });
  }
  void accumulate_f32(float* dst, const void* src, std::size_t n, Stream& s) override {
    launch(s, "accumulate_f32",
           [&](cudaStream_t cs) { gpu::launch_accumulate_f32(dst, src, n, act_, cs); });
  }
  void attention_forward(void* out, float* lse, const void* qkv, const AttentionArgs& a,
                         Stream& s) override {
    launch(s, "attention_forward", [&](cudaStream_t cs) {
      gpu::launch_attention_forward(out, lse, qkv, dims("attention_forward", a), act_, cs);
    });
  }
  void attention_decode(void* out, const void* qkv, int pos, const AttentionArgs& a,
                        Stream& s) override {
    constexpr const char* op = "attention_decode";
    const gpu::AttentionDims d = dims(op, a);
    // The scratch follows this device's SM count, so it is sized with the device current.
    run(s, op, [&](gpu::Stream& cs) {
      cs.with_scratch(gpu::attention_decode_scratch_floats(d) * 4, op, [&](void* scratch) {
        gpu::launch_attention_decode(out, qkv, pos, d, act_, static_cast<float*>(scratch),
                                     cs.get());
      });
    });
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* lse, const AttentionArgs& a, Stream& s) override {
    const gpu::AttentionDims d = dims("attention_backward", a);
    launch_with_scratch(s, "attention_backward",
                        gpu::attention_backward_scratch_floats(d) * sizeof(float),
                        [&](cudaStream_t cs, void* scratch) {
                          gpu::launch_attention_backward(dqkv, dout, qkv, out, lse,
                                                         static_cast<float*>(scratch), d, act_, cs);
                        });
  }
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                       float eps, Stream& s) override {
    launch(s, "rmsnorm_forward", [&](cudaStream_t cs) {
      gpu::launch_rmsnorm_forward(out, rstd, inp, weight, N, C, eps, act_, cs);
    });
  }
  void rmsnorm_backward(void* dinp, const void* dresidual, void* dweight, const void* dout,
                        const void* inp, const void* weight, const float* rstd, int N, int C,
                        Stream& s) override {
    launch(s, "rmsnorm_backward", [&](cudaStream_t cs) {
      gpu::launch_rmsnorm_backward(dinp, dresidual, dweight, dout, inp, weight, rstd, N, C, act_,
                                   cs);
    });
  }
  void rope_forward(void* qkv, const float* inv_freq, const AttentionArgs& a, Stream& s) override {
    launch(s, "rope_forward", [&](cudaStream_t cs) {
      gpu::launch_rope_forward(qkv, inv_freq, dims("rope_forward", a), act_, cs);
    });
  }
  void rope_backward(void* dqkv, const float* inv_freq, const AttentionArgs& a,
                     Stream& s) override {
    launch(s, "rope_backward", [&](cudaStream_t cs) {
      gpu::launch_rope_backward(dqkv, inv_freq, dims("rope_backward", a), act_, cs);
    });
  }
  void swiglu_forward(void* out, const void* gate_up, int N, int I, Stream& s) override {
    launch(s, "swiglu_forward",
           [&](cudaStream_t cs) { gpu::launch_swiglu_forward(out, gate_up, N, I, act_, cs); });
  }
  void swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, int N, int I,
                       Stream& s) override {
    launch(s, "swiglu_backward", [&](cudaStream_t cs) {
      gpu::launch_swiglu_backward(dgate_up, dout, gate_up, N, I, act_, cs);
    });
  }
  void cross_entropy(float* losses, void* dlogits, const void* logits, const std::int32_t* targets,
                     int N, int V, int ld, float dloss_scale, Stream& s) override {
    launch(s, "cross_entropy", [&](cudaStream_t cs) {
      gpu::launch_cross_entropy(losses, dlogits, logits, targets, N, V, ld, dloss_scale, act_, cs);
    });
  }
  void sum_squares(float* out, const void* data, std::size_t n, Stream& s) override {
    launch_with_scratch(s, "sum_squares", gpu::sum_squares_scratch_bytes(n),
                        [&](cudaStream_t cs, void* scratch) {
                          gpu::launch_sum_squares(out, data, n, act_, scratch, cs);
                        });
  }
  void nonfinite_flag(float* flag, const void* data, std::size_t n, Stream& s) override {
    launch(s, "nonfinite_flag",
           [&](cudaStream_t cs) { gpu::launch_nonfinite_flag(flag, data, n, act_, cs); });
  }
  void step_gate(StepGate* gate, const float* sumsq, const StepGateRule& rule, Stream& s) override {
    launch(s, "step_gate", [&](cudaStream_t cs) { gpu::launch_step_gate(gate, sumsq, rule, cs); });
  }
  void cast(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n,
            Stream& s) override {
    launch(s, "cast", [&](cudaStream_t cs) { gpu::launch_cast(src, src_t, dst, dst_t, n, cs); });
  }
  void adamw(float* master, float* m, float* v, const void* grads, void* params_out, std::size_t n,
             const AdamConfig& c, std::int64_t t, float grad_mult, const std::uint64_t* run_starts,
             int num_runs, const StepGate* gate, Stream& s) override {
    launch(s, "adamw", [&](cudaStream_t cs) {
      check_adamw_args("adamw", c, t, grad_mult);  // the Device contract's own messages
      gpu::launch_adamw(master, m, v, grads, act_, params_out, act_, n, c, t, grad_mult, cs,
                        run_starts, num_runs, gate);
    });
  }

 protected:
  void release(void* data, std::size_t bytes) noexcept override { pool_->deallocate(data, bytes); }

 private:
  // Runs fn(stream) with this device current; with ZO_SYNC_EACH_OP, waits for it and names `op`
  // in the error (docs/gpu.md, "Localising a GPU fault").
  template <class Fn>
  void run(Stream& s, const char* op, Fn&& fn) {
    gpu::Stream& cs = cuda_stream(s, op);
    const gpu::DeviceGuard guard(index_);
    fn(cs);
    if (sync_each_op_) gpu::check_op_finished(op, cs.get());
  }
  template <class Fn>
  void launch(Stream& s, const char* op, Fn&& fn) {
    run(s, op, [&](gpu::Stream& cs) { fn(cs.get()); });
  }
  // fn(stream, scratch) with `bytes` of the stream's own persistent scratch: concurrent streams
  // never share it, and steady-state steps allocate nothing.
  template <class Fn>
  void launch_with_scratch(Stream& s, const char* op, std::size_t bytes, Fn&& fn) {
    run(s, op, [&](gpu::Stream& cs) {
      cs.with_scratch(bytes, op, [&](void* scratch) { fn(cs.get(), scratch); });
    });
  }
  // AttentionArgs' defaults resolved (C / NH must be whole when HS is 0); gpu/ checks the rest.
  static gpu::AttentionDims dims(const char* op, const AttentionArgs& a) {
    if (a.HS == 0 && a.NH > 0 && a.C % a.NH != 0) {
      bad_arg(op, "C = " + std::to_string(a.C) + " is not a multiple of NH = " +
                      std::to_string(a.NH) + "; the head size must be a whole number");
    }
    return {a.B, a.T, a.NH, a.kv_heads(), a.NH > 0 ? a.head_size() : 0, a.pos0};
  }
  // The GELU matmuls take packed rows (the Device contract), which gpu/ does not see.
  static void require_packed(const char* op, const MatmulArgs& m) {
    if (m.ld_out != 0 && m.ld_out != m.OC) {
      bad_arg(op, "the row stride ld_out = " + std::to_string(m.ld_out) +
                      " must be 0 or OC = " + std::to_string(m.OC));
    }
  }
  void copy(const char* op, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
            Stream& s) {
    run(s, op, [&](gpu::Stream& cs) { cs.copy(dst, src, bytes, kind); });
  }

  const int index_;
  const DType act_;
  const bool sync_each_op_;
  std::string name_;
  std::unique_ptr<gpu::MatmulContext, MatmulContextDeleter> matmul_;
  std::shared_ptr<gpu::MemoryPool> pool_;  // shared with the streams (their scratch counts here)
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  if (!valid_dtype(options.act_dtype)) {
    throw std::invalid_argument("cuda device: unknown activation dtype value " +
                                std::to_string(static_cast<int>(options.act_dtype)) +
                                " (use bf16 or fp16; fp32 for tests)");
  }
  const gpu::DeviceInfo info = gpu::require_device(options.device);
  return std::make_unique<CudaDevice>(options, info);
}

}  // namespace zo::dev

#endif  // ZO_HAVE_CUDA
