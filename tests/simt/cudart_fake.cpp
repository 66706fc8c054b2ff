// The CUDA runtime calls gpu/, src/device/cuda_device.cpp and pinned_memory/ make, over host
// memory, for the SIMT emulator (tests/simt/simt.h). The emulated build links this instead of
// libcudart, so a call not defined here fails to link, which is the signal to add it.
//
// Streams are worker threads (streams.h) and events carry record generations, so the ordering
// rules are CUDA's (stream capture for CUDA Graphs: graph.h, cudart_graph.cpp): work on a stream
// runs later than the call that enqueued it, cudaStreamWaitEvent orders against the last record
// issued before it, copies between device memory and page-locked host memory are asynchronous,
// copies to or from pageable memory wait for the stream first (as CUDA's do), and cudaFree waits
// for the whole device. Memory is tracked by range, so a copy in a certainly wrong direction or an
// unregister of memory never registered is refused.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "graph.h"
#include "simt.h"
#include "streams.h"

using Clock = std::chrono::steady_clock;

struct CUevent_st;

struct CUstream_st {
  std::deque<std::function<void()>> queue;  // guarded by g_mu
  bool busy = false;                        // the worker is running an item
  bool stop = false;
  std::thread worker;
  // While captured (graph.h), what is enqueued becomes graph nodes instead (guarded by g_mu).
  struct Capture {
    std::thread::id thread;  // the capturing thread (ThreadLocal mode)
    bool invalid = false;    // a refused call broke it: cudaStreamEndCapture fails
    std::vector<zo::simt::GraphNode> nodes;
    std::set<const CUevent_st*> events;  // recorded within the capture
  };
  std::unique_ptr<Capture> capture;
};

struct CUevent_st {
  unsigned flags = 0;
  std::uint64_t recorded = 0;   // records issued
  std::uint64_t completed = 0;  // records the device has reached
  Clock::time_point when{};     // when the last completed record was reached
};

namespace {

// The emulated device's memory: what cudaMemGetInfo reports and allocations may use.
constexpr std::size_t kDeviceBytes = std::size_t{8} << 30;

// One lock for all runtime state; waits use one condition variable (contention is irrelevant here).
std::mutex g_mu;
std::condition_variable g_cv;
std::set<CUstream_st*> g_streams;
std::map<const char*, std::size_t> g_device;  // allocation start -> bytes
std::map<const char*, std::size_t> g_pinned;  // cudaHostRegister start -> bytes
std::size_t g_device_used = 0;
cudaError_t g_sticky = cudaSuccess;  // a failed stream item poisons the context, as on a GPU
std::string g_sticky_text;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local CUstream_st* t_capturing = nullptr;  // the stream this thread is capturing

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

bool in_ranges(const std::map<const char*, std::size_t>& ranges, const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = ranges.upper_bound(c);
  if (it == ranges.begin()) return false;
  --it;
  return c < it->first + std::max<std::size_t>(it->second, 1);
}

void fail_sticky(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_sticky == cudaSuccess) {
    g_sticky = cudaErrorLaunchFailure;
    g_sticky_text = "unspecified launch failure (" + what + ")";
    std::fprintf(stderr, "SIMT emulator: a stream item failed: %s\n", what.c_str());
  }
}

void run_item(const std::function<void()>& work) {
  try {
    work();
  } catch (const std::exception& e) {
    fail_sticky(e.what());
  } catch (...) {
    fail_sticky("unknown exception");
  }
}

void worker_main(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(g_mu);
  for (;;) {
    g_cv.wait(lock, [s] { return s->stop || !s->queue.empty(); });
    if (s->queue.empty()) return;  // stop requested and nothing left
    std::function<void()> work = std::move(s->queue.front());
    s->queue.pop_front();
    s->busy = true;
    const bool poisoned = g_sticky != cudaSuccess;
    lock.unlock();
    if (!poisoned) run_item(work);  // after a fault nothing more runs, as on a GPU
    work = nullptr;                 // captured state dies outside the lock
    lock.lock();
    s->busy = false;
    g_cv.notify_all();
  }
}

bool idle(const CUstream_st* s) {
  return s->queue.empty() && !s->busy;
}

// Waits (holding `lock` on g_mu) until `s`, or every stream for nullptr, has drained.
void drain(std::unique_lock<std::mutex>& lock, const CUstream_st* s) {
  g_cv.wait(lock, [s] {
    if (s != nullptr) return idle(s);
    return std::all_of(g_streams.begin(), g_streams.end(), idle);
  });
}

cudaError_t sticky_or(cudaError_t e) {
  return record(g_sticky != cudaSuccess ? g_sticky : e);
}

// A call CUDA refuses from a thread that is capturing (ThreadLocal mode: synchronisation,
// allocation, synchronous copies): it fails and breaks the capture.
cudaError_t refused_in_capture() {
  if (t_capturing == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  if (t_capturing->capture != nullptr) t_capturing->capture->invalid = true;
  return record(cudaErrorStreamCaptureUnsupported);
}

// The stream's capture, or nullptr (holding g_mu).
CUstream_st::Capture* capture_of(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread ? nullptr
                                                                           : s->capture.get();
}

cudaError_t synchronize(const CUstream_st* s) {
  std::unique_lock<std::mutex> lock(g_mu);
  drain(lock, s);
  return sticky_or(cudaSuccess);
}

bool valid_stream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(g_mu);
  return g_streams.count(s) != 0;
}

CUstream_st* worker_of(cudaStream_t s) {
  return (s == cudaStreamLegacy || s == cudaStreamPerThread) ? nullptr : s;
}

enum class Where { kDevice, kPinned, kPageable };

Where where_is(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (in_ranges(g_device, p)) return Where::kDevice;
  return in_ranges(g_pinned, p) ? Where::kPinned : Where::kPageable;
}

std::uint64_t g_device_allocations = 0;  // successful cudaMalloc/cudaMallocAsync calls (g_mu)

void* device_alloc(std::size_t size) {
  const std::size_t bytes = (size + 255) / 256 * 256;
  std::lock_guard<std::mutex> lock(g_mu);
  if (bytes == 0 || g_device_used + bytes > kDeviceBytes) return nullptr;
  void* p = std::aligned_alloc(256, bytes);
  if (p == nullptr) return nullptr;
  // All-ones bits (NaN as floats): reading memory no kernel wrote shows up in the results.
  std::memset(p, 0xff, bytes);
  g_device[static_cast<const char*>(p)] = bytes;
  g_device_used += bytes;
  ++g_device_allocations;
  return p;
}

bool device_free(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_device.find(static_cast<const char*>(p));
  if (it == g_device.end()) return false;
  g_device_used -= it->second;
  g_device.erase(it);
  std::free(p);
  return true;
}

// Refuses a copy whose direction is certainly wrong: device memory named as the host side, or
// registered host memory named as the device side. (Other host memory may stand for device
// memory: the kernel tests keep their "device" tensors in ordinary vectors.)
cudaError_t check_copy(const void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  if (count != 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const Where d = where_is(dst), s = where_is(src);
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return s != Where::kDevice && d != Where::kPinned ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return d != Where::kDevice && s != Where::kPinned ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return d != Where::kPinned && s != Where::kPinned ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
      return cudaSuccess;
    default:
      return cudaErrorInvalidMemcpyDirection;
  }
}

// The host side of a copy, if it has one.
const void* host_side(const void* dst, const void* src, cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return src;
    case cudaMemcpyDeviceToHost:
      return dst;
    case cudaMemcpyDeviceToDevice:
      return nullptr;
    default:
      if (where_is(dst) != Where::kDevice) return dst;
      return where_is(src) != Where::kDevice ? src : nullptr;
  }
}

}  // namespace

namespace zo::simt {

void enqueue(cudaStream_t stream, std::function<void()> work) {
  CUstream_st* s = worker_of(stream);
  std::unique_lock<std::mutex> lock(g_mu);
  if (s != nullptr && s->capture != nullptr) {  // recorded, run by each cudaGraphLaunch
    if (!s->capture->invalid) s->capture->nodes.push_back([w = std::move(work)] { return w; });
    return;
  }
  if (s == nullptr) {
    drain(lock, nullptr);  // the legacy default stream waits for every stream
    if (g_sticky != cudaSuccess) return;
    lock.unlock();
    work();  // errors reach the caller directly
    return;
  }
  s->queue.push_back(std::move(work));
  g_cv.notify_all();
}

bool is_device_pointer(const void* p) {
  return where_is(p) == Where::kDevice;
}

std::uint64_t device_allocations() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_device_allocations;
}

cudaError_t begin_capture(cudaStream_t stream) {
  if (stream == nullptr || worker_of(stream) == nullptr || !valid_stream(stream))
    return record(cudaErrorInvalidValue);  // the legacy stream cannot be captured
  if (t_capturing != nullptr) return record(cudaErrorIllegalState);  // one capture per thread
  std::lock_guard<std::mutex> lock(g_mu);
  if (stream->capture != nullptr) return record(cudaErrorIllegalState);
  stream->capture = std::make_unique<CUstream_st::Capture>();
  stream->capture->thread = std::this_thread::get_id();
  t_capturing = stream;
  return cudaSuccess;
}

cudaError_t end_capture(cudaStream_t stream, std::vector<GraphNode>& nodes) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  CUstream_st::Capture* c = capture_of(stream);
  if (c == nullptr) return record(cudaErrorIllegalState);
  if (c->thread != std::this_thread::get_id()) return record(cudaErrorStreamCaptureWrongThread);
  const bool invalid = c->invalid;
  nodes = std::move(c->nodes);
  stream->capture.reset();
  t_capturing = nullptr;
  return invalid ? record(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

cudaStreamCaptureStatus capture_status(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mu);
  const CUstream_st::Capture* c = capture_of(stream);
  if (c == nullptr) return cudaStreamCaptureStatusNone;
  return c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
}

}  // namespace zo::simt

extern "C" {

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation:
      return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureWrongThread:
      return "cudaErrorStreamCaptureWrongThread";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorLaunchFailure: {
      std::lock_guard<std::mutex> lock(g_mu);  // set once, then never changed
      return g_sticky_text.empty() ? "unspecified launch failure" : g_sticky_text.c_str();
    }
    case cudaErrorHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    default:
      return "unknown error";
  }
}

// ---- the device -------------------------------------------------------------------------------

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return record(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return record(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : record(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return record(cudaErrorInvalidValue);
  if (device != 0) return record(cudaErrorInvalidDevice);
  const zo::simt::DeviceLimits& l = zo::simt::limits();
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "SIMT emulator (H100 limits)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = kDeviceBytes;
  prop->multiProcessorCount = l.sm_count;
  prop->maxThreadsPerBlock = l.max_threads_per_block;
  prop->sharedMemPerBlock = static_cast<std::size_t>(l.max_shared_default);
  prop->sharedMemPerBlockOptin = static_cast<std::size_t>(l.max_shared_optin);
  prop->warpSize = l.warp_size;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || device != 0) return record(cudaErrorInvalidValue);
  const zo::simt::DeviceLimits& l = zo::simt::limits();
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = l.sm_count;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = l.max_shared_optin;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = l.max_shared_default;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = l.max_threads_per_block;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = l.warp_size;
      return cudaSuccess;
    default:
      return record(cudaErrorInvalidValue);
  }
}

cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  if (pci_bus_id == nullptr || len <= 0) return record(cudaErrorInvalidValue);
  if (device != 0) return record(cudaErrorInvalidDevice);
  std::snprintf(pci_bus_id, static_cast<std::size_t>(len), "0000:00:00.0");
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return record(cudaErrorInvalidValue);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > zo::simt::limits().max_shared_optin)
    return record(cudaErrorInvalidValue);
  zo::simt::set_max_dynamic_shared(func, value);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  return synchronize(nullptr);
}

// ---- memory -----------------------------------------------------------------------------------

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  *total_bytes = kDeviceBytes;
  *free_bytes = kDeviceBytes - g_device_used;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  *ptr = size == 0 ? nullptr : device_alloc(size);
  return size != 0 && *ptr == nullptr ? record(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  {
    std::unique_lock<std::mutex> lock(g_mu);
    drain(lock, nullptr);  // cudaFree synchronises the device
  }
  return device_free(ptr) ? cudaSuccess : record(cudaErrorInvalidValue);
}

// In a capture CUDA would make graph-owned allocations; the project never allocates while
// capturing (gpu::Stream's scratch exists before), so the emulator refuses, stricter than CUDA.
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (ptr == nullptr || !valid_stream(stream)) return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  *ptr = size == 0 ? nullptr : device_alloc(size);
  return size != 0 && *ptr == nullptr ? record(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return cudaSuccess;
  if (!valid_stream(stream) || !zo::simt::is_device_pointer(ptr))
    return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  zo::simt::enqueue(stream, [ptr] { device_free(ptr); });
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static int the_pool;  // one opaque handle; the attributes set on it change nothing here
  if (pool == nullptr) return record(cudaErrorInvalidValue);
  if (device != 0) return record(cudaErrorInvalidDevice);
  *pool = reinterpret_cast<cudaMemPool_t>(&the_pool);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr, void* value) {
  return pool == nullptr || value == nullptr ? record(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
  return pool == nullptr ? record(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int) {
  if (ptr == nullptr || size == 0) return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  const char* c = static_cast<const char*>(ptr);
  if (in_ranges(g_pinned, c) || in_ranges(g_pinned, c + size - 1))
    return record(cudaErrorHostMemoryAlreadyRegistered);
  g_pinned[c] = size;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_pinned.erase(static_cast<const char*>(ptr)) == 1
             ? cudaSuccess
             : record(cudaErrorHostMemoryNotRegistered);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return record(e);
  if (count == 0) return cudaSuccess;
  const void* host = host_side(dst, src, kind);
  if (host != nullptr && where_is(host) == Where::kPageable) {
    // Pageable memory: CUDA waits for the stream, then copies before returning; a graph cannot.
    if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
    const cudaError_t e = synchronize(worker_of(stream));
    if (e != cudaSuccess) return e;
    std::memmove(dst, src, count);
    return cudaSuccess;
  }
  zo::simt::enqueue(stream, [dst, src, count] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = check_copy(dst, src, count, kind); e != cudaSuccess) return record(e);
  if (const cudaError_t e = synchronize(nullptr); e != cudaSuccess) return e;
  if (count != 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr || where_is(ptr) == Where::kPinned) return record(cudaErrorInvalidValue);
  zo::simt::enqueue(stream, [ptr, value, count] { std::memset(ptr, value, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr || where_is(ptr) == Where::kPinned) return record(cudaErrorInvalidValue);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  if (const cudaError_t e = synchronize(nullptr); e != cudaSuccess) return e;
  std::memset(ptr, value, count);
  return cudaSuccess;
}

// ---- streams ------------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (stream == nullptr) return record(cudaErrorInvalidValue);
  auto* s = new CUstream_st;
  s->worker = std::thread(worker_main, s);
  std::lock_guard<std::mutex> lock(g_mu);
  g_streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

// Scheduling flags only change how host threads wait; the emulator's waits always block.
cudaError_t cudaSetDeviceFlags(unsigned int) {
  return cudaSuccess;
}

// Priorities order the work of concurrent streams on a GPU; the emulator runs streams as threads
// and accepts any priority in the H100's range [-5, 0] (lower is more urgent).
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (priority > 0 || priority < -5) return record(cudaErrorInvalidValue);
  return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || !valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  {
    // Work already enqueued still runs (CUDA returns at once and finishes it in the background).
    std::unique_lock<std::mutex> lock(g_mu);
    drain(lock, stream);
    stream->stop = true;
    g_streams.erase(stream);
    g_cv.notify_all();
  }
  stream->worker.join();
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  return synchronize(worker_of(stream));
}

// Host functions run on the stream's worker in order with its kernels (CUDA runs them on a driver
// thread, with the stream held until they return).
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return record(cudaErrorInvalidValue);
  if (!valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  zo::simt::enqueue(stream, [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

// ---- events -------------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return record(cudaErrorInvalidValue);
  *event = new CUevent_st;
  (*event)->flags = flags;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  // CUDA releases an event whose record is still pending once it completes: wait for it here.
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock,
            [event] { return event->completed >= event->recorded || g_sticky != cudaSuccess; });
  lock.unlock();
  delete event;
  return cudaSuccess;
}

namespace {

// The stream item that completes record number `generation` of `event`.
std::function<void()> completes(cudaEvent_t event, std::uint64_t generation) {
  return [event, generation] {
    std::lock_guard<std::mutex> lock(g_mu);
    event->completed = std::max(event->completed, generation);
    event->when = Clock::now();
    g_cv.notify_all();
  };
}

}  // namespace

// In a capture, a plain record only marks a point of the capture that its stream may wait for
// (no graph node); with cudaEventRecordExternal it becomes a node that records the event at
// every launch.
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  if (event == nullptr || !valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  std::uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (CUstream_st::Capture* c = capture_of(stream)) {
      if ((flags & cudaEventRecordExternal) == 0) {
        c->events.insert(event);
        return cudaSuccess;
      }
      if (!c->invalid) {
        c->nodes.push_back([event] {
          std::lock_guard<std::mutex> inner(g_mu);
          return completes(event, ++event->recorded);
        });
      }
      return cudaSuccess;
    }
    generation = ++event->recorded;
  }
  zo::simt::enqueue(stream, completes(event, generation));
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return cudaEventRecordWithFlags(event, stream, cudaEventRecordDefault);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_sticky != cudaSuccess) return record(g_sticky);
  // Not ready is a status, not an error: it is not kept for cudaGetLastError.
  return event->completed >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = refused_in_capture(); e != cudaSuccess) return e;
  std::unique_lock<std::mutex> lock(g_mu);
  const std::uint64_t target = event->recorded;
  g_cv.wait(lock, [&] { return event->completed >= target || g_sticky != cudaSuccess; });
  return sticky_or(cudaSuccess);
}

// A captured stream may only wait for an event recorded in its own capture (already in order on
// one stream); any other breaks the capture (CUDA's cudaErrorStreamCaptureIsolation).
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr || !valid_stream(stream)) return record(cudaErrorInvalidResourceHandle);
  std::uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (CUstream_st::Capture* c = capture_of(stream)) {
      if (c->events.count(event) != 0) return cudaSuccess;
      c->invalid = true;
      return record(cudaErrorStreamCaptureIsolation);
    }
    target = event->recorded;  // the last record issued before this call
  }
  if (target == 0) return cudaSuccess;  // never recorded: nothing to wait for
  zo::simt::enqueue(stream, [event, target] {
    std::unique_lock<std::mutex> lock(g_mu);
    g_cv.wait(lock, [&] { return event->completed >= target || g_sticky != cudaSuccess; });
  });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mu);
  if (((start->flags | end->flags) & cudaEventDisableTiming) != 0)
    return record(cudaErrorInvalidResourceHandle);
  if (start->recorded == 0 || end->recorded == 0) return record(cudaErrorInvalidResourceHandle);
  if (start->completed < start->recorded || end->completed < end->recorded)
    return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

}  // extern "C"
