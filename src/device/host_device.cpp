// The host backend of zo::dev::Device: fp32 everywhere, 64-byte aligned allocations under an
// optional capacity, worker-thread streams (host_stream.h) and the ops of host_ops.h. Each op
// call validates its arguments eagerly (std::invalid_argument, thrown to the caller) and
// enqueues a closure; problems only visible in the data surface at Stream::synchronize().
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "cpu_adam/cpu_adam.h"
#include "device/device.h"
#include "device/host_ops.h"
#include "device/host_stream.h"

namespace zo::dev {
namespace {

constexpr std::align_val_t kAlignment{64};  // a cache line; also enough for any SIMD load

[[noreturn]] void bad_arg(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("host device: ") + op + ": " + what);
}
void require_ptr(const void* p, const char* op, const char* name) {
  if (p == nullptr) bad_arg(op, std::string(name) + " is null");
}
void require_positive(int v, const char* op, const char* name) {
  if (v <= 0) bad_arg(op, std::string(name) + " = " + std::to_string(v) + " must be > 0");
}

HostStream& host_stream(Stream& s, const char* op) {
  auto* hs = dynamic_cast<HostStream*>(&s);
  if (hs == nullptr) bad_arg(op, "the stream was not created by a host device");
  return *hs;
}
const std::shared_ptr<HostEventState>& host_event(Event& e, const char* op) {
  auto* he = dynamic_cast<HostEvent*>(&e);
  if (he == nullptr) bad_arg(op, "the event was not created by a host device");
  return he->state();
}

// More compute threads than cores only adds contention (and oneTBB warnings): clamp. Results
// do not depend on the count anyway.
int checked_threads(int threads) {
  if (threads < 0) {
    throw std::invalid_argument("host device: threads = " + std::to_string(threads) +
                                " must be >= 0 (0 uses all cores)");
  }
  const int cores = std::max(1, tbb::info::default_concurrency());
  return threads > 0 ? std::min(threads, cores) : cores;
}

float* f32(void* p) {
  return static_cast<float*>(p);
}
const float* f32(const void* p) {
  return static_cast<const float*>(p);
}

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& o)
      : capacity_(o.capacity_bytes),
        threads_(checked_threads(o.threads)),
        arena_(std::make_shared<tbb::task_arena>(threads_)) {}

  Backend backend() const override { return Backend::kHost; }
  std::string name() const override {
    return "host (fp32, " + std::to_string(threads_) + " thread" + (threads_ == 1 ? ")" : "s)");
  }
  DType act_dtype() const override { return DType::kF32; }

  // ---- memory -----------------------------------------------------------------------------
  Buffer alloc(std::size_t bytes, const char* what) override {
    const char* label = what != nullptr ? what : "(unnamed buffer)";
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (capacity_ != 0 && (bytes > capacity_ || used > capacity_ - bytes)) {
        throw OutOfMemoryError(label, bytes, used, capacity_);
      }
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    // A real pointer even for 0 bytes, so every Buffer owns something distinct.
    void* p = ::operator new(bytes == 0 ? 1 : bytes, kAlignment, std::nothrow);
    if (p == nullptr) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      throw OutOfMemoryError(label, bytes, used_.load(std::memory_order_relaxed), capacity_);
    }
    return Buffer(this, p, bytes);
  }
  std::size_t capacity_bytes() const override { return capacity_; }
  std::size_t used_bytes() const override { return used_.load(std::memory_order_relaxed); }

  // ---- streams, events, copies ------------------------------------------------------------------
  std::unique_ptr<Stream> create_stream(bool) override { return std::make_unique<HostStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<HostEvent>(); }

  void record(Event& e, Stream& s) override {
    std::shared_ptr<HostEventState> state = host_event(e, "record");
    HostStream& hs = host_stream(s, "record");
    const std::uint64_t gen = state->begin_record();
    hs.enqueue([state, gen] { state->complete(gen); }, /*always_run=*/true);
  }
  void wait(Stream& s, Event& e) override {
    std::shared_ptr<HostEventState> state = host_event(e, "wait");
    HostStream& hs = host_stream(s, "wait");
    // CUDA semantics: wait for the recording current at this call; never recorded = no-op.
    const std::uint64_t gen = state->recorded();
    if (gen == 0) return;
    hs.enqueue([state, gen] { state->wait_for(gen); });
  }

  void copy_to_device(void* dst, const void* host_src, std::size_t bytes, Stream& s) override {
    copy("copy_to_device", dst, host_src, bytes, s);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes, Stream& s) override {
    copy("copy_to_host", host_dst, src, bytes, s);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    copy("copy_on_device", dst, src, bytes, s);
  }
  void fill_zero(void* dst, std::size_t bytes, Stream& s) override {
    HostStream& hs = host_stream(s, "fill_zero");
    if (bytes == 0) return;
    require_ptr(dst, "fill_zero", "dst");
    hs.enqueue([dst, bytes] { std::memset(dst, 0, bytes); });
  }

  // ---- GPT ops ----------------------------------------------------------------------------------
  void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe,
                         int B, int T, int C, Stream& s) override {
    constexpr const char* op = "embedding_forward";
    require_btc(op, B, T, C);
    require_ptrs(op, {{out, "out"}, {tokens, "tokens"}, {wte, "wte"}});
    launch(s, op, [=](host::Arena& a) {
      host::embedding_forward(a, f32(out), tokens, f32(wte), f32(wpe), B, T, C);
    });
  }
  void embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                          int B, int T, int C, Stream& s) override {
    constexpr const char* op = "embedding_backward";
    require_btc(op, B, T, C);
    require_ptrs(op, {{dwte, "dwte"}, {dout, "dout"}, {tokens, "tokens"}});
    launch(s, op, [=](host::Arena& a) {
      host::embedding_backward(a, f32(dwte), f32(dwpe), f32(dout), tokens, B, T, C);
    });
  }

  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C, Stream& s) override {
    constexpr const char* op = "layernorm_forward";
    require_positive(N, op, "N");
    require_positive(C, op, "C");
    require_ptrs(op, {{out, "out"},
                      {mean, "mean"},
                      {rstd, "rstd"},
                      {inp, "inp"},
                      {weight, "weight"},
                      {bias, "bias"}});
    launch(s, op, [=](host::Arena& a) {
      host::layernorm_forward(a, f32(out), mean, rstd, f32(inp), f32(weight), f32(bias), N, C);
    });
  }
  void residual_layernorm_forward(void* res, void* out, float* mean, float* rstd, const void* a_in,
                                  const void* b_in, const void* weight, const void* bias, int N,
                                  int C, Stream& s) override {
    constexpr const char* op = "residual_layernorm_forward";
    require_positive(N, op, "N");
    require_positive(C, op, "C");
    require_ptrs(op, {{res, "res"},
                      {out, "out"},
                      {mean, "mean"},
                      {rstd, "rstd"},
                      {a_in, "a"},
                      {b_in, "b"},
                      {weight, "weight"},
                      {bias, "bias"}});
    launch(s, op, [=](host::Arena& a) {
      const std::size_t n = std::size_t(N) * C;
      host::residual_forward(a, f32(res), f32(a_in), f32(b_in), n);
      host::layernorm_forward(a, f32(out), mean, rstd, f32(res), f32(weight), f32(bias), N, C);
    });
  }
  void layernorm_backward(void* dinp, const void* dresidual, void* dweight, void* dbias,
                          const void* dout, const void* inp, const void* weight, const float* mean,
                          const float* rstd, int N, int C, Stream& s) override {
    constexpr const char* op = "layernorm_backward";
    require_positive(N, op, "N");
    require_positive(C, op, "C");
    require_ptrs(op, {{dinp, "dinp"},
                      {dweight, "dweight"},
                      {dbias, "dbias"},
                      {dout, "dout"},
                      {inp, "inp"},
                      {weight, "weight"},
                      {mean, "mean"},
                      {rstd, "rstd"}});
    launch(s, op, [=](host::Arena& a) {
      host::layernorm_backward(a, f32(dinp), f32(dresidual), f32(dweight), f32(dbias), f32(dout),
                               f32(inp), f32(weight), mean, rstd, N, C);
    });
  }

  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                      const MatmulArgs& m, Stream& s) override {
    constexpr const char* op = "matmul_forward";
    require_matmul(op, m);
    require_ptrs(op, {{out, "out"}, {inp, "inp"}, {weight, "weight"}});
    launch(s, op, [=](host::Arena& a) {
      host::matmul_forward(a, f32(out), f32(inp), f32(weight), f32(bias), m.N, m.C, m.OC,
                           ld_out(m));
    });
  }
  void matmul_gelu_forward(void* out, void* pre, const void* inp, const void* weight,
                           const void* bias, const MatmulArgs& m, Stream& s) override {
    constexpr const char* op = "matmul_gelu_forward";
    require_matmul(op, m, true);
    require_ptrs(op, {{out, "out"}, {pre, "pre"}, {inp, "inp"}, {weight, "weight"}});
    launch(s, op, [=](host::Arena& a) {
      host::matmul_forward(a, f32(pre), f32(inp), f32(weight), f32(bias), m.N, m.C, m.OC, m.OC);
      host::gelu_forward(a, f32(out), f32(pre), std::size_t(m.N) * m.OC);
    });
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, const MatmulArgs& m, Stream& s) override {
    constexpr const char* op = "matmul_backward";
    require_matmul(op, m);
    require_ptrs(
        op,
        {{dinp, "dinp"}, {dweight, "dweight"}, {dout, "dout"}, {inp, "inp"}, {weight, "weight"}});
    launch(s, op, [=](host::Arena& a) {
      host::matmul_backward(a, f32(dinp), f32(dweight), f32(dbias), f32(dout), f32(inp),
                            f32(weight), m.N, m.C, m.OC, ld_out(m));
    });
  }
  void matmul_dgelu_backward(void* dpre, void* dweight, void* dbias, const void* dout,
                             const void* inp, const void* weight, const void* pre,
                             const MatmulArgs& m, Stream& s) override {
    constexpr const char* op = "matmul_dgelu_backward";
    require_matmul(op, m, true);
    require_ptrs(op, {{dpre, "dpre"},
                      {dweight, "dweight"},
                      {dout, "dout"},
                      {inp, "inp"},
                      {weight, "weight"},
                      {pre, "pre"}});
    launch(s, op, [=](host::Arena& a) {
      host::matmul_backward(a, f32(dpre), f32(dweight), f32(dbias), f32(dout), f32(inp),
                            f32(weight), m.N, m.C, m.OC, m.OC);
      host::gelu_grad_in_place(a, f32(dpre), f32(pre), std::size_t(m.N) * m.C);
    });
  }

  void gelu_forward(void* out, const void* inp, std::size_t n, Stream& s) override {
    constexpr const char* op = "gelu_forward";
    if (!require_elementwise(s, op, n, {{out, "out"}, {inp, "inp"}})) return;
    launch(s, op, [=](host::Arena& a) { host::gelu_forward(a, f32(out), f32(inp), n); });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n,
                     Stream& s) override {
    constexpr const char* op = "gelu_backward";
    if (!require_elementwise(s, op, n, {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}})) return;
    launch(s, op,
           [=](host::Arena& a) { host::gelu_backward(a, f32(dinp), f32(inp), f32(dout), n); });
  }
  void residual_forward(void* out, const void* a_in, const void* b_in, std::size_t n,
                        Stream& s) override {
    constexpr const char* op = "residual_forward";
    if (!require_elementwise(s, op, n, {{out, "out"}, {a_in, "a"}, {b_in, "b"}})) return;
    launch(s, op,
           [=](host::Arena& a) { host::residual_forward(a, f32(out), f32(a_in), f32(b_in), n); });
  }
  void accumulate(void* dst, const void* src, std::size_t n, Stream& s) override {
    constexpr const char* op = "accumulate";
    if (!require_elementwise(s, op, n, {{dst, "dst"}, {src, "src"}})) return;
    launch(s, op, [=](host::Arena& a) { host::accumulate(a, f32(dst), f32(src), n); });
  }

  void accumulate_f32(float* dst, const void* src, std::size_t n, Stream& s) override {
    accumulate(dst, src, n, s);  // the act dtype is fp32 here
  }

  void attention_forward(void* out, float* lse, const void* qkv, const AttentionArgs& at,
                         Stream& s) override {
    constexpr const char* op = "attention_forward";
    require_attention(op, at);
    require_ptrs(op, {{out, "out"}, {lse, "lse"}, {qkv, "qkv"}});
    launch(s, op, [=](host::Arena& a) {
      host::attention_forward(a, f32(out), lse, f32(qkv), at.B, at.T, at.NH, at.kv_heads(),
                              at.head_size());
    });
  }
  void attention_decode(void* out, const void* qkv, int pos, const AttentionArgs& at,
                        Stream& s) override {
    constexpr const char* op = "attention_decode";
    require_attention(op, at);
    if (pos < 0 || pos >= at.T) {
      bad_arg(op, "position " + std::to_string(pos) +
                      " is outside the cache's [0, T = " + std::to_string(at.T) + ")");
    }
    require_ptrs(op, {{out, "out"}, {qkv, "qkv"}});
    launch(s, op, [=](host::Arena& a) {
      host::attention_decode(a, f32(out), f32(qkv), at.B, at.T, at.NH, at.kv_heads(),
                             at.head_size(), pos);
    });
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* lse, const AttentionArgs& at, Stream& s) override {
    constexpr const char* op = "attention_backward";
    require_attention(op, at);
    require_ptrs(op, {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}, {lse, "lse"}});
    launch(s, op, [=](host::Arena& a) {
      host::attention_backward(a, f32(dqkv), f32(dout), f32(qkv), f32(out), lse, at.B, at.T, at.NH,
                               at.kv_heads(), at.head_size());
    });
  }

  void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* weight, int N, int C,
                       float eps, Stream& s) override {
    constexpr const char* op = "rmsnorm_forward";
    require_rows(op, N, C, "C");
    if (!(eps >= 0.0f) || !std::isfinite(eps)) bad_arg(op, "eps must be finite and >= 0");
    require_ptrs(op, {{out, "out"}, {rstd, "rstd"}, {inp, "inp"}, {weight, "weight"}});
    launch(s, op, [=](host::Arena& a) {
      host::rmsnorm_forward(a, f32(out), rstd, f32(inp), f32(weight), N, C, eps);
    });
  }
  void rmsnorm_backward(void* dinp, const void* dresidual, void* dweight, const void* dout,
                        const void* inp, const void* weight, const float* rstd, int N, int C,
                        Stream& s) override {
    constexpr const char* op = "rmsnorm_backward";
    require_rows(op, N, C, "C");
    require_ptrs(op, {{dinp, "dinp"},
                      {dweight, "dweight"},
                      {dout, "dout"},
                      {inp, "inp"},
                      {weight, "weight"},
                      {rstd, "rstd"}});
    launch(s, op, [=](host::Arena& a) {
      host::rmsnorm_backward(a, f32(dinp), f32(dresidual), f32(dweight), f32(dout), f32(inp),
                             f32(weight), rstd, N, C);
    });
  }
  void rope_forward(void* qkv, const float* inv_freq, const AttentionArgs& at, Stream& s) override {
    rope("rope_forward", qkv, inv_freq, at, false, s);
  }
  void rope_backward(void* dqkv, const float* inv_freq, const AttentionArgs& at,
                     Stream& s) override {
    rope("rope_backward", dqkv, inv_freq, at, true, s);
  }
  void swiglu_forward(void* out, const void* gate_up, int N, int I, Stream& s) override {
    constexpr const char* op = "swiglu_forward";
    require_rows(op, N, I, "I");
    require_ptrs(op, {{out, "out"}, {gate_up, "gate_up"}});
    launch(s, op, [=](host::Arena& a) { host::swiglu_forward(a, f32(out), f32(gate_up), N, I); });
  }
  void swiglu_backward(void* dgate_up, const void* dout, const void* gate_up, int N, int I,
                       Stream& s) override {
    constexpr const char* op = "swiglu_backward";
    require_rows(op, N, I, "I");
    require_ptrs(op, {{dgate_up, "dgate_up"}, {dout, "dout"}, {gate_up, "gate_up"}});
    launch(s, op, [=](host::Arena& a) {
      host::swiglu_backward(a, f32(dgate_up), f32(dout), f32(gate_up), N, I);
    });
  }

  void cross_entropy(float* losses, void* dlogits, const void* logits, const std::int32_t* targets,
                     int N, int V, int ld, float dloss_scale, Stream& s) override {
    constexpr const char* op = "cross_entropy";
    require_positive(N, op, "N");
    require_positive(V, op, "V");
    if (ld < V) {
      bad_arg(op, "the row stride ld = " + std::to_string(ld) +
                      " is less than V = " + std::to_string(V));
    }
    require_ptrs(op, {{losses, "losses"}, {logits, "logits"}, {targets, "targets"}});
    launch(s, op, [=](host::Arena& a) {
      host::cross_entropy(a, losses, f32(dlogits), f32(logits), targets, N, V, ld, dloss_scale);
    });
  }

  void sum_squares(float* out, const void* data, std::size_t n, Stream& s) override {
    constexpr const char* op = "sum_squares";
    if (!require_elementwise(s, op, n, {{out, "out"}, {data, "data"}})) return;
    launch(s, op, [=](host::Arena& a) { host::sum_squares(a, out, f32(data), n); });
  }
  void nonfinite_flag(float* flag, const void* data, std::size_t n, Stream& s) override {
    constexpr const char* op = "nonfinite_flag";
    if (!require_elementwise(s, op, n, {{flag, "flag"}, {data, "data"}})) return;
    launch(s, op, [=](host::Arena& a) { host::nonfinite_flag(a, flag, f32(data), n); });
  }
  void step_gate(StepGate* gate, const float* sumsq, const StepGateRule& rule, Stream& s) override {
    constexpr const char* op = "step_gate";
    if (!require_elementwise(s, op, 1, {{gate, "gate"}, {sumsq, "sumsq"}})) return;
    launch(s, op, [=](host::Arena&) { *gate = zo::step_gate(static_cast<double>(*sumsq), rule); });
  }
  void cast(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n,
            Stream& s) override {
    constexpr const char* op = "cast";
    for (DType t : {dst_t, src_t}) {
      if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
        bad_arg(op, "unknown dtype value " + std::to_string(static_cast<int>(t)));
      }
    }
    if (!require_elementwise(s, op, n, {{dst, "dst"}, {src, "src"}})) return;
    launch(s, op, [=](host::Arena& a) { host::cast(a, dst, dst_t, src, src_t, n); });
  }

  void adamw(float* master, float* m, float* v, const void* grads, void* params_out, std::size_t n,
             const AdamConfig& c, std::int64_t t, float grad_mult, const std::uint64_t* run_starts,
             int num_runs, const StepGate* gate, Stream& s) override {
    constexpr const char* op = "adamw";
    check_adamw_args(op, c, t, grad_mult);
    if (run_starts != nullptr && num_runs <= 0) bad_arg(op, "a run table needs num_runs >= 1");
    if (reinterpret_cast<std::uintptr_t>(run_starts) % sizeof(std::uint64_t) != 0)
      bad_arg(op, "the run table is not 8-byte aligned");
    if (!require_elementwise(s, op, n, {{master, "master"}, {m, "m"}, {v, "v"}, {grads, "grads"}}))
      return;
    if (reinterpret_cast<std::uintptr_t>(gate) % alignof(StepGate) != 0)
      bad_arg(op, "the gate is not 4-byte aligned");
    launch(s, op, [=](host::Arena&) {
      // The same fused kernel as the host optimizer, run by run (the table and the gate are read
      // when the op runs, as the GPU's kernel reads them); fp32 on this backend, so params_out
      // (if it is not the master itself) is a plain copy.
      if (gate != nullptr && gate->skip != 0) return;
      const float mult = gate != nullptr ? gate->grad_mult : grad_mult;
      AdamConfig plain = c;
      plain.weight_decay = 0.0f;
      const cpu_adam::CpuAdam decaying(c), not_decaying(plain);
      const auto* g = static_cast<const float*>(grads);
      const int runs = run_starts != nullptr ? num_runs : 1;
      for (int r = 0; r < runs; ++r) {
        const std::uint64_t entry = run_starts != nullptr ? run_starts[r] : kAdamRunDecays;
        const std::size_t begin = entry & ~kAdamRunDecays;
        const std::size_t end = r + 1 < runs ? run_starts[r + 1] & ~kAdamRunDecays : n;
        if ((r == 0 && begin != 0) || end <= begin || end > n)
          throw std::invalid_argument("adamw: run table entry " + std::to_string(r) +
                                      " is out of order or past n");
        cpu_adam::AdamBuffers b;
        b.params = {master + begin, end - begin};
        b.exp_avg = {m + begin, end - begin, DType::kF32};
        b.exp_avg_sq = {v + begin, end - begin, DType::kF32};
        b.grads = {g + begin, end - begin, DType::kF32};
        const bool decays = (entry & kAdamRunDecays) != 0;
        (decays ? decaying : not_decaying).update(b, t, {mult, cpu_adam::NonFinitePolicy::kReport});
      }
      if (params_out != nullptr && params_out != master) std::memcpy(params_out, master, n * 4);
    });
  }

 protected:
  void release(void* data, std::size_t bytes) noexcept override {
    ::operator delete(data, kAlignment);
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  }

 private:
  struct Named {
    const void* p;
    const char* name;
  };

  // Enqueues fn(arena) on s. The closure holds the arena, so it outlives the device if needed.
  template <class Fn>
  void launch(Stream& s, const char* op, Fn&& fn) {
    host_stream(s, op).enqueue([arena = arena_, fn = std::forward<Fn>(fn)] { fn(*arena); });
  }

  void copy(const char* op, void* dst, const void* src, std::size_t bytes, Stream& s) {
    HostStream& hs = host_stream(s, op);
    if (bytes == 0) return;
    require_ptrs(op, {{dst, "dst"}, {src, "src"}});
    // memmove: a copy_on_device between overlapping ranges of one buffer stays well defined.
    hs.enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
  }

  static void require_ptrs(const char* op, std::initializer_list<Named> ptrs) {
    for (const Named& p : ptrs)
      require_ptr(p.p, op, p.name);
  }
  static void require_btc(const char* op, int B, int T, int C) {
    require_positive(B, op, "B");
    require_positive(T, op, "T");
    require_positive(C, op, "C");
  }
  // packed: the op takes no row stride (ld_out must be 0 or OC).
  static void require_matmul(const char* op, const MatmulArgs& m, bool packed = false) {
    require_positive(m.N, op, "N");
    require_positive(m.C, op, "C");
    require_positive(m.OC, op, "OC");
    if (m.ld_out != 0 && (m.ld_out < m.OC || (packed && m.ld_out != m.OC))) {
      bad_arg(op, "the row stride ld_out = " + std::to_string(m.ld_out) +
                      (packed ? " must be 0 or OC = " : " is less than OC = ") +
                      std::to_string(m.OC));
    }
  }
  static int ld_out(const MatmulArgs& m) { return m.ld_out != 0 ? m.ld_out : m.OC; }
  static void require_rows(const char* op, int N, int C, const char* c_name) {
    require_positive(N, op, "N");
    require_positive(C, op, c_name);
  }
  static void require_attention(const char* op, const AttentionArgs& a) {
    require_btc(op, a.B, a.T, a.C);
    require_positive(a.NH, op, "NH");
    if (a.NKV < 0 || a.HS < 0) bad_arg(op, "NKV and HS must be >= 0 (0: the default)");
    if (a.HS == 0 && a.C % a.NH != 0) {
      bad_arg(op, "C = " + std::to_string(a.C) + " is not a multiple of NH = " +
                      std::to_string(a.NH) + "; the head size must be a whole number");
    }
    if (a.NH % a.kv_heads() != 0) {
      bad_arg(op, "NH = " + std::to_string(a.NH) + " is not a multiple of NKV = " +
                      std::to_string(a.NKV) + "; each kv head serves a whole group of query heads");
    }
  }
  void rope(const char* op, void* qkv, const float* inv_freq, const AttentionArgs& at, bool inverse,
            Stream& s) {
    require_attention(op, at);
    if (at.pos0 < 0) bad_arg(op, "pos0 = " + std::to_string(at.pos0) + " must be >= 0");
    if (at.head_size() % 2 != 0) {
      bad_arg(op,
              "head size " + std::to_string(at.head_size()) + " must be even (pairs i, i+hs/2)");
    }
    require_ptrs(op, {{qkv, "qkv"}, {inv_freq, "inv_freq"}});
    launch(s, op, [=](host::Arena& a) {
      host::rope(a, f32(qkv), inv_freq, at.B, at.T, at.NH, at.kv_heads(), at.head_size(), at.pos0,
                 inverse);
    });
  }
  // Validates an n-element op; false when n == 0 (nothing to enqueue).
  static bool require_elementwise(Stream& s, const char* op, std::size_t n,
                                  std::initializer_list<Named> ptrs) {
    host_stream(s, op);
    if (n == 0) return false;
    require_ptrs(op, ptrs);
    return true;
  }

  std::size_t capacity_;
  std::atomic<std::size_t> used_{0};
  int threads_;
  std::shared_ptr<tbb::task_arena> arena_;  // shared with queued tasks
};

}  // namespace

std::unique_ptr<Device> make_host_device(const HostDeviceOptions& options) {
  return std::make_unique<HostDevice>(options);
}

}  // namespace zo::dev
