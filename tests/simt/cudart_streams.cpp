// The emulated runtime's streams and events (cudart_state.h): a stream is a worker thread running
// its items in order (streams.h); an event counts the records issued and the records its streams
// have reached, so cudaStreamWaitEvent orders against the last record issued before it and
// cudaEventSynchronize waits for that one. Records and waits inside a stream capture follow
// CUDA's rules (cudart_graph.cpp launches what was captured).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cudart_state.h"
#include "streams.h"

using namespace zo::simt::rt;

extern "C" {

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

// CUDA returns at once and releases an event whose record is still pending once it completes;
// work that waits for it still waits. Queued markers and waits hold the handle, so it is kept
// until the process ends (waiting here instead would drain streams a real destroy does not).
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  static auto* destroyed = new std::vector<CUevent_st*>;  // guarded by g_mu; never freed
  std::lock_guard<std::mutex> lock(g_mu);
  destroyed->push_back(event);
  return cudaSuccess;
}

namespace {

// The stream item that completes record number `generation` of `event`.
std::function<void()> completes(cudaEvent_t event, std::uint64_t generation) {
  return [event, generation] {
    std::lock_guard<std::mutex> lock(g_mu);
    event->completed = std::max(event->completed, generation);
    event->when = std::chrono::steady_clock::now();
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
        c->nodes.push_back({[event] {
                              std::lock_guard<std::mutex> inner(g_mu);
                              return completes(event, ++event->recorded);
                            },
                            {}});
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
