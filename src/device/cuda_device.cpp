// The CUDA backend of zo::dev::Device: adapts gpu/'s launchers (gpu/ops.h, gpu/cast.h) to the
// op interface. Each call makes the device current on the calling thread, validates what the
// launchers cannot see (the stream's and event's backend) and enqueues; nothing synchronises
// except Stream/Event::synchronize and the allocator's rare cache flush.
#ifdef ZO_HAVE_CUDA

#include "device/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpu/cast.h"
#include "gpu/check.h"
#include "gpu/device.h"
#include "gpu/ops.h"

namespace zo::dev {
namespace {

[[noreturn]] void bad_arg(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("cuda device: ") + op + ": " + what);
}

// Makes `device` current on this thread for the guard's lifetime; the previous device comes back
// afterwards, so callers that juggle devices themselves are not surprised.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    ZO_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      ZO_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// The same for destructors and release paths: never throws, ignores failures.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) noexcept {
    switched_ = cudaGetDevice(&previous_) == cudaSuccess && previous_ != device &&
                cudaSetDevice(device) == cudaSuccess;
    (void)cudaGetLastError();
  }
  ~QuietDeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// ---- memory -------------------------------------------------------------------------------------

constexpr std::size_t kSmallGranule = 512;                   // below kLargeThreshold
constexpr std::size_t kLargeThreshold = 1u << 20;            // 1 MiB
constexpr std::size_t kLargeGranule = std::size_t{2} << 20;  // 2 MiB

// Size classes: at most 511 B lost per small block and 2 MiB per large one; 0 bytes still get a
// distinct block.
std::size_t granule_size(std::size_t bytes) {
  const std::size_t g = bytes < kLargeThreshold ? kSmallGranule : kLargeGranule;
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + g - 1) / g * g;
  if (rounded < bytes) throw std::length_error("cuda device: allocation size overflows");
  return rounded;
}

// A caching allocator: freed blocks go to a free list per rounded size and are handed out again
// without cudaMalloc; the cache is flushed (cudaFree, which synchronises the device) only when a
// miss would exceed the capacity or cudaMalloc fails. Shared by the device and its streams (whose
// stream-ordered scratch is accounted here too), so it outlives whichever goes last.
class MemoryPool {
 public:
  MemoryPool(int device, std::size_t capacity) : device_(device), capacity_(capacity) {}
  ~MemoryPool() {
    QuietDeviceGuard guard(device_);
    flush_locked();
  }
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  std::size_t capacity() const { return capacity_; }
  std::size_t in_use() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }

  // Called with the device current.
  void* allocate(std::size_t bytes, const char* what) {
    const std::size_t size = granule_size(bytes);
    const std::lock_guard<std::mutex> lock(mu_);
    check_capacity_locked(size, bytes, what);
    if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_ -= size;
      in_use_ += size;
      return p;
    }
    // A miss. Cached blocks of other sizes count against the capacity as well: drop them first
    // when the new block would not fit beside them.
    if (held_ + scratch_ + size > capacity_) flush_locked();
    void* p = nullptr;
    cudaError_t status = cudaMalloc(&p, size);
    if (status == cudaErrorMemoryAllocation) {
      // Give back what this process caches: our free lists and the stream-ordered pool's
      // unused memory (flush_locked's cudaFree synchronises, so its pending frees are done).
      (void)cudaGetLastError();
      flush_locked();
      trim_stream_ordered_pool();
      status = cudaMalloc(&p, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw OutOfMemoryError(std::string(what) + " (cudaMalloc failed: memory is held outside " +
                                 "this process or fragmented)",
                             bytes, in_use_, capacity_);
    }
    ZO_CUDA_CHECK(status);
    held_ += size;
    in_use_ += size;
    return p;
  }

  void deallocate(void* p, std::size_t bytes) noexcept {
    const std::size_t size = granule_size_noexcept(bytes);
    const std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= std::min(in_use_, size);
    try {
      free_[size].push_back(p);
      cached_ += size;
    } catch (...) {  // no memory for the free list: give the block back instead
      QuietDeviceGuard guard(device_);
      (void)cudaFree(p);
      (void)cudaGetLastError();
      held_ -= std::min(held_, size);
    }
  }

  // Accounting for memory allocated elsewhere (stream-ordered scratch): throws OutOfMemoryError
  // like allocate() when it would not fit.
  void reserve(std::size_t bytes, const char* what) {
    const std::lock_guard<std::mutex> lock(mu_);
    check_capacity_locked(bytes, bytes, what);
    if (held_ + scratch_ + bytes > capacity_) {
      QuietDeviceGuard guard(device_);
      flush_locked();
    }
    in_use_ += bytes;
    scratch_ += bytes;
  }
  void unreserve(std::size_t bytes) noexcept {
    const std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= std::min(in_use_, bytes);
    scratch_ -= std::min(scratch_, bytes);
  }

 private:
  static std::size_t granule_size_noexcept(std::size_t bytes) noexcept {
    const std::size_t g = bytes < kLargeThreshold ? kSmallGranule : kLargeGranule;
    return (std::max<std::size_t>(bytes, 1) + g - 1) / g * g;
  }

  void check_capacity_locked(std::size_t size, std::size_t requested, const char* what) const {
    if (size > capacity_ || in_use_ > capacity_ - size) {
      throw OutOfMemoryError(what, requested, in_use_, capacity_);
    }
  }

  void trim_stream_ordered_pool() noexcept {
    cudaMemPool_t pool = nullptr;
    if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) {
      (void)cudaDeviceSynchronize();
      (void)cudaMemPoolTrimTo(pool, 0);
    }
    (void)cudaGetLastError();
  }

  // cudaFree of every cached block; the caller holds mu_ (or is the destructor).
  void flush_locked() noexcept {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        if (cudaFree(p) != cudaSuccess) {
          (void)cudaGetLastError();
          std::fprintf(stderr, "warning: cudaFree of a cached device block failed\n");
        }
        held_ -= std::min(held_, size);
      }
    }
    free_.clear();
    cached_ = 0;
  }

  const int device_;
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::size_t in_use_ = 0;   // rounded bytes of live blocks plus reserved scratch
  std::size_t held_ = 0;     // bytes obtained with cudaMalloc: live and cached blocks
  std::size_t cached_ = 0;   // bytes in free_
  std::size_t scratch_ = 0;  // reserved stream-ordered scratch
  std::map<std::size_t, std::vector<void*>> free_;
};

// ---- streams and events
// --------------------------------------------------------------------------

class CudaStream final : public Stream {
 public:
  CudaStream(int device, std::shared_ptr<MemoryPool> pool)
      : device_(device), pool_(std::move(pool)) {
    DeviceGuard guard(device_);
    ZO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // Queued work still completes after cudaStreamDestroy; the scratch is freed in stream order.
  ~CudaStream() override {
    QuietDeviceGuard guard(device_);
    if (scratch_ != nullptr) {
      (void)cudaFreeAsync(scratch_, stream_);
      pool_->unreserve(scratch_bytes_);
    }
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void synchronize() override {
    DeviceGuard guard(device_);
    ZO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

  // A float scratch of at least `floats` elements, valid for work enqueued on this stream while
  // the caller holds scratch_mutex(). Grows in stream order (cudaFreeAsync / cudaMallocAsync), so
  // kernels still using the old block are unaffected. Called with the device current.
  float* scratch(std::size_t floats, const char* what) {
    const std::size_t bytes = floats * sizeof(float);
    if (bytes <= scratch_bytes_) return static_cast<float*>(scratch_);
    const std::size_t size = granule_size(bytes);
    if (scratch_ != nullptr) {
      ZO_CUDA_CHECK(cudaFreeAsync(scratch_, stream_));
      pool_->unreserve(scratch_bytes_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    pool_->reserve(size, what);
    void* p = nullptr;
    const cudaError_t status = cudaMallocAsync(&p, size, stream_);
    if (status != cudaSuccess) {
      pool_->unreserve(size);
      if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        throw OutOfMemoryError(std::string(what) + " (cudaMallocAsync failed)", bytes,
                               pool_->in_use(), pool_->capacity());
      }
      ZO_CUDA_CHECK(status);
    }
    scratch_ = p;
    scratch_bytes_ = size;
    return static_cast<float*>(scratch_);
  }
  std::mutex& scratch_mutex() { return scratch_mu_; }

 private:
  const int device_;
  std::shared_ptr<MemoryPool> pool_;
  cudaStream_t stream_ = nullptr;
  std::mutex scratch_mu_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

// cudaErrorNotReady from a query is a status, not a failure: keep it out of later launch checks.
void clear_not_ready() noexcept {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) : device_(device) {
    DeviceGuard guard(device_);
    ZO_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDefault));  // timing enabled
  }
  ~CudaEvent() override {
    QuietDeviceGuard guard(device_);
    (void)cudaEventDestroy(event_);
    (void)cudaGetLastError();
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Never recorded: returns at once (CUDA semantics, as the host backend).
  void synchronize() override { ZO_CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool query() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      clear_not_ready();
      return false;
    }
    ZO_CUDA_CHECK(status);
    return true;
  }
  double elapsed_ms_since(Event& start) override {
    auto* begin = dynamic_cast<CudaEvent*>(&start);
    if (begin == nullptr) bad_arg("elapsed_ms_since", "the start event is not a CUDA event");
    float ms = 0.0f;
    const cudaError_t status = cudaEventElapsedTime(&ms, begin->event_, event_);
    if (status == cudaErrorNotReady) {
      clear_not_ready();
      throw std::logic_error(
          "elapsed_ms_since: an event has not completed yet; synchronize it first");
    }
    if (status == cudaErrorInvalidResourceHandle) {
      (void)cudaGetLastError();
      throw std::logic_error(
          "elapsed_ms_since: an event was never recorded (or belongs to "
          "another device)");
    }
    ZO_CUDA_CHECK(status);
    return ms;
  }

  cudaEvent_t get() const { return event_; }

 private:
  const int device_;
  cudaEvent_t event_ = nullptr;
};

CudaStream& cuda_stream(Stream& s, const char* op) {
  auto* cs = dynamic_cast<CudaStream*>(&s);
  if (cs == nullptr) bad_arg(op, "the stream was not created by a CUDA device");
  return *cs;
}
CudaEvent& cuda_event(Event& e, const char* op) {
  auto* ce = dynamic_cast<CudaEvent*>(&e);
  if (ce == nullptr) bad_arg(op, "the event was not created by a CUDA device");
  return *ce;
}

struct MatmulContextDeleter {
  void operator()(gpu::MatmulContext* ctx) const noexcept { gpu::destroy_matmul_context(ctx); }
};

bool valid_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// ---- the device
// -----------------------------------------------------------------------------------

// The debug switch ZO_SYNC_EACH_OP: set and not "0".
bool sync_each_op_requested() {
  const char* v = std::getenv("ZO_SYNC_EACH_OP");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

class CudaDevice final : public Device {
 public:
  CudaDevice(const CudaDeviceOptions& o, const gpu::DeviceInfo& info)
      : index_(info.index), act_(o.act_dtype), sync_each_op_(sync_each_op_requested()) {
    DeviceGuard guard(index_);
    name_ = "cuda:" + std::to_string(index_) + " " + info.name + " (" +
            std::string(dtype_name(act_)) + ")";
    matmul_.reset(gpu::create_matmul_context());
    // Kernels take small per-call scratch with cudaMallocAsync (layernorm/embedding backward,
    // sum of squares): keep freed pool memory cached instead of returning it to the OS at every
    // synchronisation, so the step does no real allocation after the first one.
    cudaMemPool_t pool = nullptr;
    ZO_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
    std::uint64_t keep = UINT64_MAX;
    ZO_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    // Measured after the context's own allocations, so the capacity is what ops can use.
    std::size_t free_bytes = 0, total_bytes = 0;
    ZO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // By default everything free except a margin for what is allocated outside this pool:
    // NCCL's buffers (at init and at the first collectives), the cudaMallocAsync scratch above,
    // cuBLASLt's and the runtime's own growth.
    const std::size_t margin = std::max<std::size_t>(kDefaultMarginBytes, total_bytes / 50);
    const std::size_t capacity = o.capacity_bytes == 0
                                     ? (free_bytes > margin ? free_bytes - margin : 0)
                                     : std::min(o.capacity_bytes, free_bytes);
    pool_ = std::make_shared<MemoryPool>(index_, capacity);
  }
  ~CudaDevice() override {
    QuietDeviceGuard guard(index_);
    matmul_.reset();  // waits for queued GEMMs before freeing their workspace
  }

  Backend backend() const override { return Backend::kCuda; }
  std::string name() const override { return name_; }
  int cuda_ordinal() const override { return index_; }
  DType act_dtype() const override { return act_; }

  // ---- memory -----------------------------------------------------------------------------
  Buffer alloc(std::size_t bytes, const char* what) override {
    DeviceGuard guard(index_);
    return Buffer(this, pool_->allocate(bytes, what != nullptr ? what : "(unnamed buffer)"), bytes);
  }
  std::size_t capacity_bytes() const override { return pool_->capacity(); }
  std::size_t used_bytes() const override { return pool_->in_use(); }

  // ---- streams, events, copies --------------------------------------------------------------
  std::unique_ptr<Stream> create_stream() override {
    return std::make_unique<CudaStream>(index_, pool_);
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(index_); }

  void record(Event& e, Stream& s) override {
    CudaEvent& ce = cuda_event(e, "record");
    CudaStream& cs = cuda_stream(s, "record");
    DeviceGuard guard(index_);
    ZO_CUDA_CHECK(cudaEventRecord(ce.get(), cs.get()));
  }
  void wait(Stream& s, Event& e) override {
    CudaEvent& ce = cuda_event(e, "wait");
    CudaStream& cs = cuda_stream(s, "wait");
    DeviceGuard guard(index_);
    ZO_CUDA_CHECK(cudaStreamWaitEvent(cs.get(), ce.get(), 0));
  }

  // Pageable host memory works too (the runtime stages it); pinned memory overlaps with compute.
  void copy_to_device(void* dst, const void* host_src, std::size_t bytes, Stream& s) override {
    copy("copy_to_device", dst, host_src, bytes, cudaMemcpyHostToDevice, s);
  }
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes, Stream& s) override {
    copy("copy_to_host", host_dst, src, bytes, cudaMemcpyDeviceToHost, s);
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    constexpr const char* op = "copy_on_device";
    CudaStream& cs = cuda_stream(s, op);
    if (bytes == 0 || dst == src) return;
    require_ptrs(op, {{dst, "dst"}, {src, "src"}});
    DeviceGuard guard(index_);
    const auto d = reinterpret_cast<std::uintptr_t>(dst);
    const auto r = reinterpret_cast<std::uintptr_t>(src);
    if (d + bytes <= r || r + bytes <= d) {
      ZO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cs.get()));
      return;
    }
    // Overlapping ranges (memmove semantics, as on the host): go through a stream-ordered copy.
    pool_->reserve(bytes, "copy_on_device staging");
    void* tmp = nullptr;
    const cudaError_t status = cudaMallocAsync(&tmp, bytes, cs.get());
    if (status != cudaSuccess) {
      pool_->unreserve(bytes);
      ZO_CUDA_CHECK(status);
    }
    cudaError_t copied = cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, cs.get());
    if (copied == cudaSuccess) {
      copied = cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, cs.get());
    }
    const cudaError_t freed = cudaFreeAsync(tmp, cs.get());
    pool_->unreserve(bytes);
    ZO_CUDA_CHECK(copied);
    ZO_CUDA_CHECK(freed);
  }
  void fill_zero(void* dst, std::size_t bytes, Stream& s) override {
    constexpr const char* op = "fill_zero";
    CudaStream& cs = cuda_stream(s, op);
    if (bytes == 0) return;
    require_ptrs(op, {{dst, "dst"}});
    DeviceGuard guard(index_);
    ZO_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cs.get()));
  }

  // ---- GPT ops ----------------------------------------------------------------------------------
  void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe,
                         int B, int T, int C, Stream& s) override {
    launch(s, "embedding_forward", [&](cudaStream_t cs) {
      gpu::launch_embedding_forward(out, tokens, wte, wpe, B, T, C, act_, cs);
    });
  }
  void embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                          int B, int T, int C, Stream& s) override {
    launch(s, "embedding_backward", [&](cudaStream_t cs) {
      gpu::launch_embedding_backward(dwte, dwpe, dout, tokens, B, T, C, act_, cs);
    });
  }

  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                         const void* bias, int N, int C, Stream& s) override {
    launch(s, "layernorm_forward", [&](cudaStream_t cs) {
      gpu::launch_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, act_, cs);
    });
  }
  void layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                          const void* weight, const float* mean, const float* rstd, int N, int C,
                          Stream& s) override {
    launch(s, "layernorm_backward", [&](cudaStream_t cs) {
      gpu::launch_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                     act_, cs);
    });
  }

  void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                      const MatmulArgs& m, Stream& s) override {
    launch(s, "matmul_forward", [&](cudaStream_t cs) {
      gpu::launch_matmul_forward(matmul_.get(), out, inp, weight, bias, m.N, m.C, m.OC, act_, cs);
    });
  }
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, const MatmulArgs& m, Stream& s) override {
    launch(s, "matmul_backward", [&](cudaStream_t cs) {
      gpu::launch_matmul_backward(matmul_.get(), dinp, dweight, dbias, dout, inp, weight, m.N, m.C,
                                  m.OC, act_, cs);
    });
  }

  void gelu_forward(void* out, const void* inp, std::size_t n, Stream& s) override {
    launch_n(s, "gelu_forward", n,
             [&](cudaStream_t cs) { gpu::launch_gelu_forward(out, inp, n, act_, cs); });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n,
                     Stream& s) override {
    launch_n(s, "gelu_backward", n,
             [&](cudaStream_t cs) { gpu::launch_gelu_backward(dinp, inp, dout, n, act_, cs); });
  }
  void residual_forward(void* out, const void* a, const void* b, std::size_t n,
                        Stream& s) override {
    launch_n(s, "residual_forward", n,
             [&](cudaStream_t cs) { gpu::launch_residual_forward(out, a, b, n, act_, cs); });
  }
  void accumulate(void* dst, const void* src, std::size_t n, Stream& s) override {
    launch_n(s, "accumulate", n,
             [&](cudaStream_t cs) { gpu::launch_accumulate(dst, src, n, act_, cs); });
  }

  void attention_forward(void* out, float* lse, const void* qkv, const AttentionArgs& a,
                         Stream& s) override {
    launch(s, "attention_forward", [&](cudaStream_t cs) {
      gpu::launch_attention_forward(out, lse, qkv, a.B, a.T, a.C, a.NH, act_, cs);
    });
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                          const float* lse, const AttentionArgs& a, Stream& s) override {
    constexpr const char* op = "attention_backward";
    CudaStream& cs = cuda_stream(s, op);
    if (a.B <= 0 || a.T <= 0 || a.NH <= 0) {
      bad_arg(op, "B = " + std::to_string(a.B) + ", T = " + std::to_string(a.T) +
                      ", NH = " + std::to_string(a.NH) + " must all be > 0");
    }
    DeviceGuard guard(index_);
    // One scratch per stream: concurrent streams never share it, and growth is stream-ordered.
    const std::lock_guard<std::mutex> lock(cs.scratch_mutex());
    float* scratch = cs.scratch(std::size_t(a.B) * std::size_t(a.NH) * std::size_t(a.T),
                                "attention backward scratch");
    gpu::launch_attention_backward(dqkv, dout, qkv, out, lse, scratch, a.B, a.T, a.C, a.NH, act_,
                                   cs.get());
  }

  void cross_entropy(float* losses, void* dlogits, const void* logits, const std::int32_t* targets,
                     int N, int V, float dloss_scale, Stream& s) override {
    launch(s, "cross_entropy", [&](cudaStream_t cs) {
      gpu::launch_cross_entropy(losses, dlogits, logits, targets, N, V, dloss_scale, act_, cs);
    });
  }

  void sum_squares(float* out, const void* data, std::size_t n, Stream& s) override {
    launch_n(s, "sum_squares", n,
             [&](cudaStream_t cs) { gpu::launch_sum_squares(out, data, n, act_, cs); });
  }
  void nonfinite_flag(float* flag, const void* data, std::size_t n, Stream& s) override {
    launch_n(s, "nonfinite_flag", n,
             [&](cudaStream_t cs) { gpu::launch_nonfinite_flag(flag, data, n, act_, cs); });
  }
  void cast(void* dst, DType dst_t, const void* src, DType src_t, std::size_t n,
            Stream& s) override {
    constexpr const char* op = "cast";
    for (DType t : {dst_t, src_t}) {
      if (!valid_dtype(t))
        bad_arg(op, "unknown dtype value " + std::to_string(static_cast<int>(t)));
    }
    launch_n(s, op, n, [&](cudaStream_t cs) { gpu::launch_cast(src, src_t, dst, dst_t, n, cs); });
  }

  void adamw(float* master, float* m, float* v, const void* grads, void* params_out, std::size_t n,
             const AdamConfig& c, std::int64_t t, float grad_mult, Stream& s) override {
    constexpr const char* op = "adamw";
    CudaStream& cs = cuda_stream(s, op);
    check_adamw_args(op, c, t, grad_mult);  // eagerly, before any n == 0 shortcut
    if (n == 0) return;
    DeviceGuard guard(index_);
    gpu::launch_adamw(master, m, v, grads, act_, params_out, act_, n, c, t, grad_mult, cs.get());
  }

 protected:
  void release(void* data, std::size_t bytes) noexcept override { pool_->deallocate(data, bytes); }

 private:
  struct Named {
    const void* p;
    const char* name;
  };
  static void require_ptrs(const char* op, std::initializer_list<Named> ptrs) {
    for (const Named& p : ptrs) {
      if (p.p == nullptr) bad_arg(op, std::string(p.name) + " is null");
    }
  }

  // Runs fn(cuda stream) with this device current; the launchers validate the rest.
  template <class Fn>
  void launch(Stream& s, const char* op, Fn&& fn) {
    CudaStream& cs = cuda_stream(s, op);
    DeviceGuard guard(index_);
    fn(cs.get());
    if (sync_each_op_) check_op_finished(op, cs.get());
  }

  // The same for an n-element op; nothing is enqueued for n == 0 (the stream is still checked).
  template <class Fn>
  void launch_n(Stream& s, const char* op, std::size_t n, Fn&& fn) {
    CudaStream& cs = cuda_stream(s, op);
    if (n == 0) return;
    DeviceGuard guard(index_);
    fn(cs.get());
    if (sync_each_op_) check_op_finished(op, cs.get());
  }

  // ZO_SYNC_EACH_OP=1: wait for each op and name it in the error, so that a fault raised while a
  // kernel runs is pinned on that op instead of surfacing at a later, unrelated synchronisation.
  static void check_op_finished(const char* op, cudaStream_t s) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
      throw gpu::CudaError(e, std::string("cuda device: op ") + op + " failed on the GPU: " +
                                  gpu::cuda_error_text(e) + " (found by ZO_SYNC_EACH_OP=1)");
    }
  }

  void copy(const char* op, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
            Stream& s) {
    CudaStream& cs = cuda_stream(s, op);
    if (bytes == 0) return;
    require_ptrs(op, {{dst, "dst"}, {src, "src"}});
    DeviceGuard guard(index_);
    ZO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cs.get()));
    if (sync_each_op_) check_op_finished(op, cs.get());
  }

  const int index_;
  const DType act_;
  const bool sync_each_op_;
  std::string name_;
  std::unique_ptr<gpu::MatmulContext, MatmulContextDeleter> matmul_;
  std::shared_ptr<MemoryPool> pool_;  // shared with the streams (their scratch is accounted here)
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

void* cuda_stream_handle(Stream& s) {
  auto* c = dynamic_cast<CudaStream*>(&s);
  if (c == nullptr) throw std::logic_error("cuda_stream_handle: not a CUDA stream");
  return c->get();
}

}  // namespace zo::dev

#endif  // ZO_HAVE_CUDA
