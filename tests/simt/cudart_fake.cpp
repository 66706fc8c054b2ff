// The CUDA runtime calls gpu/, src/device/cuda_device.cpp and pinned_memory/ make, over host
// memory, for the SIMT emulator (tests/simt/simt.h). The emulated build links this file,
// cudart_memory.cpp, cudart_streams.cpp and cudart_graph.cpp instead of libcudart, so a call not
// defined in them fails to link, which is the signal to add it. This file: the shared state
// (cudart_state.h), the stream workers, stream capture, errors and the device.
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
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "cudart_state.h"
#include "graph.h"
#include "simt.h"
#include "streams.h"

namespace zo::simt::rt {

std::mutex g_mu;
std::condition_variable g_cv;
std::set<CUstream_st*> g_streams;
cudaError_t g_sticky = cudaSuccess;

namespace {

std::string g_sticky_text;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local CUstream_st* t_capturing = nullptr;  // the stream this thread is capturing

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

bool idle(const CUstream_st* s) {
  return s->queue.empty() && !s->busy;
}

}  // namespace

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

void worker_main(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(g_mu);
  for (;;) {
    g_cv.wait(lock, [s] { return s->stop || !s->queue.empty(); });
    if (s->queue.empty()) return;  // stop requested and nothing left
    s->running = std::move(s->queue.front());
    s->queue.pop_front();
    std::function<void()> work = std::move(s->running.work);
    s->busy = true;
    const bool poisoned = g_sticky != cudaSuccess;
    lock.unlock();
    if (!poisoned) run_item(work);  // after a fault nothing more runs, as on a GPU
    work = nullptr;                 // captured state dies outside the lock
    lock.lock();
    s->running.uses.clear();
    s->busy = false;
    g_cv.notify_all();
  }
}

void drain(std::unique_lock<std::mutex>& lock, const CUstream_st* s) {
  g_cv.wait(lock, [s] {
    if (s != nullptr) return idle(s);
    return std::all_of(g_streams.begin(), g_streams.end(), idle);
  });
}

cudaError_t sticky_or(cudaError_t e) {
  return record(g_sticky != cudaSuccess ? g_sticky : e);
}

cudaError_t refused_in_capture() {
  if (t_capturing == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  if (t_capturing->capture != nullptr) t_capturing->capture->invalid = true;
  return record(cudaErrorStreamCaptureUnsupported);
}

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

}  // namespace zo::simt::rt

using namespace zo::simt::rt;

namespace zo::simt {

void enqueue(cudaStream_t stream, std::function<void()> work, std::vector<Use> uses,
             const char* what) {
  CUstream_st* s = worker_of(stream);
  std::unique_lock<std::mutex> lock(g_mu);
  if (s != nullptr && s->capture != nullptr) {  // recorded, run by each cudaGraphLaunch
    if (!s->capture->invalid) {
      s->capture->nodes.push_back({[w = std::move(work)] { return w; }, std::move(uses)});
    }
    return;
  }
  if (s == nullptr) {
    drain(lock, nullptr);  // the legacy default stream waits for every stream
    if (g_sticky != cudaSuccess) return;
    lock.unlock();
    work();  // errors reach the caller directly
    return;
  }
  s->queue.push_back({std::move(work), std::move(uses), what});
  g_cv.notify_all();
}

void check_released(const void* p, std::size_t bytes, const char* what) {
  const char* lo = static_cast<const char*>(p);
  const char* hi = lo + std::max<std::size_t>(bytes, 1);
  const auto used = [&](const CUstream_st::Item& item) {
    return std::any_of(item.uses.begin(), item.uses.end(), [&](const Use& u) {
      const char* b = static_cast<const char*>(u.p);
      return b < hi && lo < b + std::max<std::size_t>(u.bytes, 1);
    });
  };
  std::lock_guard<std::mutex> lock(g_mu);
  for (const CUstream_st* s : g_streams) {
    const CUstream_st::Item* user = s->busy && used(s->running) ? &s->running : nullptr;
    for (auto it = s->queue.begin(); user == nullptr && it != s->queue.end(); ++it)
      if (used(*it)) user = &*it;
    if (user == nullptr) continue;
    std::fprintf(stderr,
                 "SIMT emulator: %s [%p, +%zu bytes) was released while %s %s on a stream "
                 "still uses it (a free before the stream was drained)\n",
                 what, p, bytes, user->what, user == &s->running ? "running" : "queued");
    std::abort();
  }
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

}  // extern "C"
