// Streams of the emulated CUDA runtime (tests/simt/cudart_fake.cpp): each stream created with
// cudaStreamCreate* is a worker thread that runs what is enqueued on it in order, later than the
// call that enqueued it, so that a missing event, wait or synchronisation shows up as a wrong
// answer or a ThreadSanitizer report instead of passing by luck. The legacy default stream
// (nullptr) runs its work at once on the calling thread, after every stream has drained.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace zo::simt {

// Runs `work` on `stream` after everything enqueued there before it. An exception thrown by
// `work` becomes the stream's sticky error (cudaErrorLaunchFailure from the next synchronising
// call, its message printed to stderr and kept for cudaGetErrorString); on the default stream
// it propagates to the caller.
void enqueue(cudaStream_t stream, std::function<void()> work);

// True for a pointer inside memory from cudaMalloc/cudaMallocAsync (the emulated device).
bool is_device_pointer(const void* p);

// How many cudaMalloc/cudaMallocAsync calls have allocated so far (a test hook: steady-state
// steps allocate nothing).
std::uint64_t device_allocations();

}  // namespace zo::simt
