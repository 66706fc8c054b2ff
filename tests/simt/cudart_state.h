// The emulated CUDA runtime's shared state, private to its three files: cudart_fake.cpp (stream
// workers, errors, the device), cudart_memory.cpp (allocations, registration, copies) and
// cudart_streams.cpp (streams and events). One lock guards all of it.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "graph.h"
#include "streams.h"

struct CUevent_st;

struct CUstream_st {
  struct Item {
    std::function<void()> work;
    std::vector<zo::simt::Use> uses;
    const char* what;
  };
  std::deque<Item> queue;  // guarded by g_mu
  Item running;            // the item the worker runs (its work moved out), while busy
  bool busy = false;       // the worker is running an item
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
  std::uint64_t recorded = 0;                    // records issued
  std::uint64_t completed = 0;                   // records the device has reached
  std::chrono::steady_clock::time_point when{};  // when the last completed record was reached
};

namespace zo::simt::rt {

// The emulated device's memory: what cudaMemGetInfo reports and allocations may use.
inline constexpr std::size_t kDeviceBytes = std::size_t{8} << 30;

// One lock for all runtime state; waits use one condition variable (contention is irrelevant here).
extern std::mutex g_mu;
extern std::condition_variable g_cv;
extern std::set<CUstream_st*> g_streams;
extern cudaError_t g_sticky;  // a failed stream item poisons the context, as on a GPU

// e kept for cudaGetLastError when it is an error; returns e.
cudaError_t record(cudaError_t e);
// The sticky error if the context is poisoned, else e (recorded).
cudaError_t sticky_or(cudaError_t e);
// A stream's worker thread: runs its items in order.
void worker_main(CUstream_st* s);
// Waits (holding `lock` on g_mu) until `s`, or every stream for nullptr, has drained.
void drain(std::unique_lock<std::mutex>& lock, const CUstream_st* s);
// drain, then the sticky error or success.
cudaError_t synchronize(const CUstream_st* s);
// A call CUDA refuses from a thread that is capturing (ThreadLocal mode: synchronisation,
// allocation, synchronous copies): it fails and breaks the capture; success otherwise.
cudaError_t refused_in_capture();
// The stream's capture, or nullptr (holding g_mu).
CUstream_st::Capture* capture_of(cudaStream_t s);
bool valid_stream(cudaStream_t s);
// The stream's worker, or nullptr for the legacy default stream.
CUstream_st* worker_of(cudaStream_t s);

}  // namespace zo::simt::rt
