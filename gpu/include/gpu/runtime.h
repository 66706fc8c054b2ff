// The CUDA runtime pieces a device backend is built from (src/device/cuda_device.cpp adapts them
// to zo::dev::Device): the current-device guard, a caching allocator with capacity accounting,
// RAII streams and events, the ZO_SYNC_EACH_OP debug switch, and page-locking of host memory for
// pinned_memory. A failing runtime call throws zo::gpu::CudaError (gpu/check.h); a request past
// the allocator's capacity throws zo::OutOfMemoryError (core/error.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zo::gpu {

// ---- the current device
// --------------------------------------------------------------------------

// Makes `device` current on this thread for the guard's lifetime; the previous device comes back
// afterwards, so callers that juggle devices themselves are not surprised. Throws CudaError.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// The same for destructors and release paths: never throws, ignores failures.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) noexcept;
  ~QuietDeviceGuard();
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// ---- device memory
// -------------------------------------------------------------------------------

// What MemoryPool::open leaves outside the pool by default (or 2% of the device, the larger).
inline constexpr std::size_t kDefaultMarginBytes = std::size_t{512} << 20;

// A caching allocator under a capacity. Sizes round up to a class (512 B granules below 1 MiB,
// 2 MiB above; 0 bytes still get a distinct block) and in_use() counts the rounded sizes; freed
// blocks go to a free list per class and are handed out again without cudaMalloc. The cache is
// flushed (cudaFree, which synchronises the device) only when a miss would exceed the capacity or
// cudaMalloc fails. Shared (std::shared_ptr) by a device and its streams, whose stream-ordered
// scratch is accounted here too, so it outlives whichever goes last. Thread-safe. A block may only
// be deallocated once no queued work uses it.
class MemoryPool {
 public:
  // The pool of device `device`, sized after what the caller has allocated so far (the cuBLASLt
  // workspace): capacity_bytes == 0 takes the free memory less max(kDefaultMarginBytes, 2% of
  // the total), left for NCCL's buffers, the kernels' stream-ordered scratch and the runtime's
  // own growth; otherwise min(capacity_bytes, free memory). Also makes the device's
  // stream-ordered pool keep freed memory cached instead of returning it at every
  // synchronisation, so a training step does no real allocation after the first one.
  static std::shared_ptr<MemoryPool> open(int device, std::size_t capacity_bytes);

  MemoryPool(int device, std::size_t capacity);
  ~MemoryPool();  // cudaFree of the cached blocks
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // The size class of an allocation of `bytes`; throws std::length_error when it overflows.
  static std::size_t size_class(std::size_t bytes);

  int device() const noexcept { return device_; }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t in_use() const;

  // A block of at least `bytes` on the pool's device. Throws OutOfMemoryError naming `what` when
  // the capacity would be exceeded, or when cudaMalloc fails even after this process gave back
  // what it caches (memory held by others, or fragmented).
  void* allocate(std::size_t bytes, const char* what);
  // Back to the cache; `bytes` as passed to allocate.
  void deallocate(void* p, std::size_t bytes) noexcept;

  // Accounting for memory allocated elsewhere (stream-ordered scratch): throws OutOfMemoryError
  // like allocate() when it would not fit.
  void reserve(std::size_t bytes, const char* what);
  void unreserve(std::size_t bytes) noexcept;

 private:
  void check_capacity_locked(std::size_t size, std::size_t requested, const char* what) const;
  void trim_stream_ordered_pool() noexcept;
  void flush_locked() noexcept;

  const int device_;
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::size_t in_use_ = 0;   // rounded bytes of live blocks plus reserved scratch
  std::size_t held_ = 0;     // bytes obtained with cudaMalloc: live and cached blocks
  std::size_t scratch_ = 0;  // reserved stream-ordered scratch
  std::map<std::size_t, std::vector<void*>> free_;
};

// ---- streams and events
// --------------------------------------------------------------------------

class Event;

// A non-blocking CUDA stream on one device (RAII, move-only) with the runtime work a backend
// enqueues besides kernels: copies, fills, event waits, and a per-stream scratch accounted in
// the device's MemoryPool. Work still queued completes after destruction. Each call makes the
// stream's device current for its duration.
class Stream {
 public:
  // high_priority: the device's most urgent stream priority (copy streams, whose small kernels and
  // copies should not queue behind compute).
  Stream(int device, std::shared_ptr<MemoryPool> pool, bool high_priority = false);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

  void synchronize();         // blocks until the work enqueued so far is done
  void wait(const Event& e);  // later work waits for e's last record

  // bytes from src to dst in `kind`'s direction (named in errors as copy_to_device,
  // copy_to_host or copy_on_device). Pageable host memory works too (the runtime stages it and
  // the call may wait, as CUDA's do); page-locked memory overlaps with compute. Device ranges may
  // overlap (memmove semantics, through a stream-ordered staging block accounted in the pool).
  // Throws std::invalid_argument for a null pointer when bytes > 0.
  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
  void fill_zero(void* dst, std::size_t bytes);

  // Runs fn(scratch) with a scratch of at least `bytes` device bytes (256-aligned), valid for the
  // work fn enqueues on this stream; other callers of this stream's scratch wait meanwhile. The
  // block persists with the stream, so ops in steady state allocate nothing; it grows in stream
  // order (cudaFreeAsync / cudaMallocAsync), so kernels still using the old block are unaffected,
  // and is accounted in the pool (OutOfMemoryError naming `what`). fn must not call with_scratch.
  // The block may not grow while the stream is capturing a graph (std::logic_error): run the work
  // once before capturing it.
  template <class Fn>
  void with_scratch(std::size_t bytes, const char* what, Fn&& fn) {
    const std::lock_guard<std::mutex> lock(scratch_->mu);
    fn(grow_scratch(bytes, what));
  }
  // Counts the scratch's moves: a graph captured before the last one refers to a freed block.
  std::uint64_t scratch_epoch() const;
  bool capturing() const;  // a graph capture is under way on this stream

 private:
  struct Scratch {
    std::mutex mu;
    void* p = nullptr;
    std::size_t bytes = 0;
    std::uint64_t epoch = 0;  // moves so far
  };
  void* grow_scratch(std::size_t bytes, const char* what);  // with scratch_->mu held
  void destroy() noexcept;

  int device_ = -1;
  std::shared_ptr<MemoryPool> pool_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Scratch> scratch_;
};

// A CUDA event with timing (RAII, move-only). One never recorded is complete (CUDA semantics):
// synchronize returns at once and query is true.
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const noexcept { return event_; }

  void record(const Stream& s);  // completes when the work enqueued so far on s does
  void synchronize();
  bool query();  // true if complete
  // Milliseconds from `start` to this event; std::logic_error when one of them has not completed
  // or was never recorded.
  double elapsed_ms_since(const Event& start) const;

 private:
  int device_ = -1;
  cudaEvent_t event_ = nullptr;
};

// ---- localising a GPU fault (docs/gpu.md)
// ------------------------------------------------------------

// The debug switch ZO_SYNC_EACH_OP: set and not "0".
bool sync_each_op_requested();

// Waits for the work on `s` and throws CudaError naming `op` when it (or an earlier launch)
// failed: "cuda device: op <op> failed on the GPU: <error> (found by ZO_SYNC_EACH_OP=1)". With
// ZO_SYNC_EACH_OP a backend calls it after every op, so that a fault raised while a kernel runs
// is pinned on that op instead of surfacing at a later, unrelated synchronisation.
void check_op_finished(const char* op, cudaStream_t s);

// ---- page-locked host memory
// ------------------------------------------------------------------------- The CUDA side of
// pinned_memory's PageLocker (pinned_memory/pinned_buffer.h); the trainer plugs these in
// (src/device/make_device.cpp, staging_pin_options).

// Why this process cannot page-lock memory for a GPU (no usable device, no driver), or nullopt.
// Decided once per process; the first call initialises the CUDA driver.
std::optional<std::string> page_lock_unavailable_reason();
// cudaHostRegister of [data, data + bytes) for the current device, or for every device when
// `portable`; nullopt on success, else a sentence naming the size, the error and what to check.
std::optional<std::string> page_lock(void* data, std::size_t bytes, bool portable);
// cudaHostUnregister; failures (the runtime already torn down at exit) are ignored.
void page_unlock(void* data) noexcept;

}  // namespace zo::gpu
