// Streams of the emulated CUDA runtime (tests/simt/cudart_fake.cpp): each stream created with
// cudaStreamCreate* is a worker thread that runs what is enqueued on it in order, later than the
// call that enqueued it, so that a missing event, wait or synchronisation shows up as a wrong
// answer or a ThreadSanitizer report instead of passing by luck. The legacy default stream
// (nullptr) runs its work at once on the calling thread, after every stream has drained.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace zo::simt {

// Memory a stream item reads or writes: [p, p + bytes). A kernel's pointer arguments count one
// byte each (where they point; the emulator does not know how far a kernel reads).
struct Use {
  const void* p;
  std::size_t bytes;
};

// Runs `work` on `stream` after everything enqueued there before it. An exception thrown by
// `work` becomes the stream's sticky error (cudaErrorLaunchFailure from the next synchronising
// call, its message printed to stderr and kept for cudaGetErrorString); on the default stream
// it propagates to the caller. `uses` and `what` (a static string naming the work) are kept
// until the work has run, for check_released.
void enqueue(cudaStream_t stream, std::function<void()> work, std::vector<Use> uses = {},
             const char* what = "stream work");

// Memory handed back (to the caching allocator, or page-locked memory unregistered) must not be
// used by work still queued or running on a stream: as AddressSanitizer does for a
// use-after-free, this prints what still uses [p, p + bytes) and aborts.
void check_released(const void* p, std::size_t bytes, const char* what);

// True for a pointer inside memory from cudaMalloc/cudaMallocAsync (the emulated device).
bool is_device_pointer(const void* p);

// How many cudaMalloc/cudaMallocAsync calls have allocated so far (a test hook: steady-state
// steps allocate nothing).
std::uint64_t device_allocations();

}  // namespace zo::simt
