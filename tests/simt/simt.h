// A SIMT emulator that runs this project's CUDA kernels on the CPU, so that CI (no GPU) executes
// every kernel and launcher in gpu/ against the host backend (tests/test_simt.cpp).
//
// Model: a launch runs its blocks one after another on one OS thread (its stream's worker, see
// streams.h, or the caller's for the default stream); the threads of a block are fibers (fiber.h),
// each running until it reaches a barrier, a warp sync or its end, scheduled warp by warp: one
// warp runs through its shuffles and warp collectives until it reaches a barrier before the next
// warp starts. Memory is host memory, so "device pointers" are plain pointers.
//
// What it checks, beyond the results (each violation throws zo::simt::SimtError naming the block,
// the threads and the call site):
//   - __syncthreads() that not every live thread of the block reaches (divergent barrier),
//   - __shfl_*_sync whose mask names a lane that does not exist, has exited, or is at another
//     call site, and lanes that read a lane outside the mask; the same for the warp-wide matrix
//     instructions (warp_matrix.h), which need all 32 lanes,
//   - launch configurations the hardware refuses: empty or oversized blocks and grids, and dynamic
//     shared memory above 48 KiB unless cudaFuncSetAttribute raised the kernel's limit (at most
//     the emulated H100's 227 KiB).
// What it cannot check: timing, the memory model between blocks, and everything the real
// hardware does differently from this sequential schedule (see docs/testing.md).
#pragma once

#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace zo::simt {

class SimtError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The emulated device's limits (an H100 SXM: 132 SMs, 227 KiB opt-in shared memory per block).
struct DeviceLimits {
  int sm_count = 132;
  int max_threads_per_block = 1024;
  int max_shared_default = 48 * 1024;
  int max_shared_optin = 227 * 1024;
  int warp_size = 32;
};
const DeviceLimits& limits();

// Runs `thread_body` once per thread of every block of the grid. `kernel` identifies the kernel
// for its shared-memory limit (set_max_dynamic_shared); `name` goes into messages. Throws
// SimtError for a bad configuration or a violated rule, and rethrows what a thread threw.
void launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, const void* kernel,
            const char* name, const std::function<void()>& thread_body);

// The configuration checks of launch() alone (for a launch enqueued to run later on a stream).
void check_launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, const void* kernel,
                  const char* name);

// cudaFuncAttributeMaxDynamicSharedMemorySize for `kernel`; throws above the opt-in limit.
void set_max_dynamic_shared(const void* kernel, int bytes);

// Counters over all launches of this process (tests use them to show work really ran).
struct Stats {
  std::uint64_t launches = 0;
  std::uint64_t threads = 0;
  std::uint64_t block_barriers = 0;
  std::uint64_t warp_syncs = 0;        // shuffles and warp collectives
  std::uint64_t warp_collectives = 0;  // mma.sync and ldmatrix
};
Stats stats();

// ---- used by the kernel prelude (tests/simt/prelude.h)
// -------------------------------------------
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void syncthreads(const std::source_location& where = std::source_location::current());
void* dynamic_shared();

// The value of lane `src_lane(lane)` for every lane of `mask` (all of which must call this from
// the same site). 16 bytes at most.
void shuffle_bytes(unsigned mask, const void* in, void* out, std::size_t bytes, int src_lane,
                   const std::source_location& where);
int lane_id();

template <typename T>
T shfl_xor(unsigned mask, T v, int lane_mask, int width, const std::source_location& where) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffle of a small value");
  const int lane = lane_id();
  // CUDA: a lane whose partner lies in a later group of `width` lanes gets its own value.
  int src = lane ^ lane_mask;
  if (src >= (lane / width + 1) * width) src = lane;
  T out;
  shuffle_bytes(mask, &v, &out, sizeof(T), src, where);
  return out;
}

// ---- warp-wide collectives: mma.sync and ldmatrix (warp_matrix.h)
// Runs once per warp when all 32 lanes have arrived: in[l] holds lane l's operands, out[l] takes
// its result; `variant` carries the instruction's qualifiers. It may throw SimtError.
constexpr std::size_t kWarpOperandBytes = 48;
constexpr std::size_t kWarpResultBytes = 16;
using WarpOp = void (*)(const unsigned char* const* in, unsigned char* const* out, int variant);

// Every lane of the warp calls this from the same site with the same op and variant (a lane
// that has exited, is missing from the block, or waits elsewhere is a SimtError, as for
// shuffles); returns this lane's result in `out`.
void warp_collective(WarpOp op, int variant, const void* in, std::size_t in_bytes, void* out,
                     std::size_t out_bytes, const std::source_location& where);

// Throws the SimtError of a rule the calling thread broke at `where`, naming kernel and thread.
[[noreturn]] void thread_error(const std::string& what, const std::source_location& where);

// Whether [p, p + bytes) lies in the running block's dynamic shared memory.
bool in_dynamic_shared(const void* p, std::size_t bytes);

// The calling thread's cp.async copies not yet performed, in issue order, and the end of each
// committed group in `copies` (warp_matrix.cpp); empty when a thread starts.
struct AsyncCopy {
  void* dst;
  const void* src;
  int bytes, src_bytes;
};
struct AsyncCopies {
  std::vector<AsyncCopy> copies;
  std::vector<std::size_t> group_ends;
};
AsyncCopies& async_copies();

}  // namespace zo::simt
