// Device guards, streams, events, the ZO_SYNC_EACH_OP check and page-locking (gpu/runtime.h).
#include "gpu/runtime.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "core/bytes.h"
#include "core/error.h"
#include "gpu/check.h"
#include "gpu/device.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

// cudaErrorNotReady from a query is a status, not a failure: keep it out of later launch checks.
void clear_not_ready() noexcept {
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
}

const char* copy_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return "copy_to_device";
    case cudaMemcpyDeviceToHost:
      return "copy_to_host";
    case cudaMemcpyDeviceToDevice:
      return "copy_on_device";
    default:
      return "copy";
  }
}

}  // namespace

// ---- the current device
// --------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) {
  ZO_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    ZO_CUDA_CHECK(cudaSetDevice(device));
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

QuietDeviceGuard::QuietDeviceGuard(int device) noexcept {
  switched_ = cudaGetDevice(&previous_) == cudaSuccess && previous_ != device &&
              cudaSetDevice(device) == cudaSuccess;
  (void)cudaGetLastError();
}

QuietDeviceGuard::~QuietDeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

// ---- streams
// -------------------------------------------------------------------------------------

Stream::Stream(int device, std::shared_ptr<MemoryPool> pool, bool high_priority)
    : device_(device), pool_(std::move(pool)), scratch_(std::make_unique<Scratch>()) {
  const DeviceGuard guard(device_);
  int least = 0, greatest = 0;
  if (high_priority) ZO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  ZO_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking,
                                             high_priority ? greatest : least));
}

Stream::~Stream() {
  destroy();
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_),
      pool_(std::move(other.pool_)),
      stream_(std::exchange(other.stream_, nullptr)),
      scratch_(std::move(other.scratch_)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    destroy();
    device_ = other.device_;
    pool_ = std::move(other.pool_);
    stream_ = std::exchange(other.stream_, nullptr);
    scratch_ = std::move(other.scratch_);
  }
  return *this;
}

// Queued work still completes after cudaStreamDestroy; the scratch is freed in stream order.
void Stream::destroy() noexcept {
  if (stream_ == nullptr) return;
  const QuietDeviceGuard guard(device_);
  if (scratch_ != nullptr && scratch_->p != nullptr) {
    (void)cudaFreeAsync(scratch_->p, stream_);
    pool_->unreserve(scratch_->bytes);
  }
  (void)cudaStreamDestroy(stream_);
  (void)cudaGetLastError();
  stream_ = nullptr;
}

void Stream::synchronize() {
  const DeviceGuard guard(device_);
  ZO_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Stream::wait(const Event& e) {
  const DeviceGuard guard(device_);
  ZO_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.get(), 0));
}

void Stream::copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  const char* op = copy_name(kind);
  if (bytes == 0 || (kind == cudaMemcpyDeviceToDevice && dst == src)) return;
  detail::check_not_null(op, {{dst, "dst"}, {src, "src"}});
  const DeviceGuard guard(device_);
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto r = reinterpret_cast<std::uintptr_t>(src);
  if (kind != cudaMemcpyDeviceToDevice || d + bytes <= r || r + bytes <= d) {
    ZO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
    return;
  }
  // Overlapping device ranges (memmove semantics, as on the host): through the stream's scratch.
  with_scratch(bytes, "copy_on_device staging", [&](void* tmp) {
    ZO_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    ZO_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, stream_));
  });
}

void Stream::fill_zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  detail::check_not_null("fill_zero", {{dst, "dst"}});
  const DeviceGuard guard(device_);
  ZO_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void* Stream::grow_scratch(std::size_t bytes, const char* what) {
  Scratch& s = *scratch_;
  if (bytes <= s.bytes) return s.p;
  const DeviceGuard guard(device_);
  if (capturing()) {
    throw std::logic_error(std::string(what) + " needs " + std::to_string(bytes) +
                           " bytes of stream scratch, more than the stream holds, while a CUDA "
                           "graph is being captured on it: run the work once before capturing it");
  }
  const std::size_t size = MemoryPool::size_class(bytes);
  if (s.p != nullptr) {
    ZO_CUDA_CHECK(cudaFreeAsync(s.p, stream_));
    pool_->unreserve(s.bytes);
    s.p = nullptr;
    s.bytes = 0;
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
  s.p = p;
  s.bytes = size;
  ++s.epoch;
  return p;
}

std::uint64_t Stream::scratch_epoch() const {
  const std::lock_guard<std::mutex> lock(scratch_->mu);
  return scratch_->epoch;
}

bool Stream::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ZO_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;
}

// ---- events
// --------------------------------------------------------------------------------------

Event::Event(int device) : device_(device) {
  const DeviceGuard guard(device_);
  // Timing enabled; a host thread waiting on it sleeps instead of spinning on a core that CPU
  // Adam needs.
  ZO_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventBlockingSync));
}

Event::~Event() {
  if (event_ == nullptr) return;
  const QuietDeviceGuard guard(device_);
  (void)cudaEventDestroy(event_);
  (void)cudaGetLastError();
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(const Stream& s) {
  const DeviceGuard guard(device_);
  ZO_CUDA_CHECK(cudaEventRecord(event_, s.get()));
}

void Event::synchronize() {
  ZO_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool Event::query() {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    clear_not_ready();
    return false;
  }
  ZO_CUDA_CHECK(status);
  return true;
}

double Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  const cudaError_t status = cudaEventElapsedTime(&ms, start.event_, event_);
  if (status == cudaErrorNotReady) {
    clear_not_ready();
    throw std::logic_error(
        "elapsed_ms_since: an event has not completed yet; synchronize it first");
  }
  if (status == cudaErrorInvalidResourceHandle) {
    (void)cudaGetLastError();
    throw std::logic_error(
        "elapsed_ms_since: an event was never recorded (or belongs to another device)");
  }
  ZO_CUDA_CHECK(status);
  return ms;
}

// ---- localising a GPU fault
// ----------------------------------------------------------------------

bool sync_each_op_requested() {
  const char* v = std::getenv("ZO_SYNC_EACH_OP");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

void check_op_finished(const char* op, cudaStream_t s) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    throw CudaError(e, std::string("cuda device: op ") + op + " failed on the GPU: " +
                           cuda_error_text(e) + " (found by ZO_SYNC_EACH_OP=1)");
  }
}

// ---- page-locked host memory
// ---------------------------------------------------------------------

std::optional<std::string> page_lock_unavailable_reason() {
  static const std::optional<std::string> reason = []() -> std::optional<std::string> {
    const DeviceCount found = count_devices();
    if (!found.error.empty()) {
      return "no usable CUDA device (cudaGetDeviceCount: " + found.error +
             "), so there is nothing to page-lock for; check the driver with `nvidia-smi`";
    }
    if (found.count == 0) {
      return std::string(
          "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and `nvidia-smi`), so there is "
          "nothing to page-lock for");
    }
    return std::nullopt;
  }();
  return reason;
}

std::optional<std::string> page_lock(void* data, std::size_t bytes, bool portable) {
  const unsigned flags = portable ? cudaHostRegisterPortable : cudaHostRegisterDefault;
  const cudaError_t err = cudaHostRegister(data, bytes, flags);
  if (err == cudaSuccess) return std::nullopt;
  (void)cudaGetLastError();
  return "cudaHostRegister of " + format_bytes(bytes) + " (" + std::to_string(bytes) +
         " bytes) failed: " + cuda_error_text(err) +
         "; check the locked-memory limit (`ulimit -l`; raise it with `ulimit -l unlimited`) and "
         "free host memory";
}

void page_unlock(void* data) noexcept {
  // Fails only when the runtime is already torn down (static destruction at exit), where the
  // driver releases the pages with the context anyway.
  if (cudaHostUnregister(data) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace zo::gpu
