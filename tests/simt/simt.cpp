// The SIMT emulator's scheduler (tests/simt/simt.h): blocks in order, a block's threads as
// fibers (fiber.h), barriers and warp syncs (warp_sync.cpp) as scheduling points.
#include "simt.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "block.h"
#include "fiber.h"

namespace zo::simt {

thread_local Block* t_block = nullptr;
thread_local Fiber* t_fiber = nullptr;
std::atomic<std::uint64_t> g_warp_syncs{0}, g_warp_collectives{0};

std::string where(const std::source_location& s) {
  std::string file = s.file_name();
  if (auto slash = file.find_last_of('/'); slash != std::string::npos)
    file = file.substr(slash + 1);
  return file + ":" + std::to_string(s.line());
}

std::string thread_name(const Block& b, const Fiber& f) {
  std::ostringstream out;
  out << "block (" << b.idx.x << "," << b.idx.y << "," << b.idx.z << ") thread (" << f.tid.x << ","
      << f.tid.y << "," << f.tid.z << ")";
  return out.str();
}

[[noreturn]] void fail(const Block& b, const std::string& what) {
  throw SimtError(std::string("SIMT emulator, kernel ") + b.name + ": " + what);
}

namespace {

constexpr std::size_t kStackBytes = 256 * 1024;  // per thread; kernels keep small locals
std::atomic<std::uint64_t> g_launches{0}, g_threads{0}, g_block_barriers{0};
std::mutex g_attr_mutex;
std::map<const void*, int>& smem_limits() {
  static std::map<const void*, int> limits;
  return limits;
}

void fiber_main() {
  Block& b = *t_block;
  try {
    (*b.body)();
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  t_fiber->state = State::kDone;
  ++b.exited[t_fiber->linear / kWarp];
  switch_fiber(t_fiber->context, b.scheduler);  // for good: the scheduler never resumes it
}

// Releases the threads waiting at a complete barrier; false when none is complete.
bool release(Block& b) {
  std::vector<Fiber>& fibers = *b.fibers;
  const auto live = std::count_if(fibers.begin(), fibers.end(),
                                  [](const Fiber& f) { return f.state != State::kDone; });
  const auto at_barrier = std::count_if(
      fibers.begin(), fibers.end(), [](const Fiber& f) { return f.state == State::kBlockBarrier; });
  if (live > 0 && at_barrier == live) {
    const std::source_location site = std::find_if(fibers.begin(), fibers.end(), [](auto& f) {
                                        return f.state == State::kBlockBarrier;
                                      })->site;
    for (Fiber& f : fibers) {
      if (f.state != State::kBlockBarrier) continue;
      // __syncthreads() at two different places is one barrier on sm_70+, but in this project it
      // always means a bug (a barrier inside a branch not every thread takes).
      if (f.site.line() != site.line() || std::string(f.site.file_name()) != site.file_name()) {
        fail(b, "__syncthreads() reached at " + where(site) + " by some threads and at " +
                    where(f.site) + " by " + thread_name(b, f));
      }
    }
    for (Fiber& f : fibers)
      if (f.state == State::kBlockBarrier) f.state = State::kReady;
    ++g_block_barriers;
    return true;
  }
  bool released = false;
  for (int warp_base = 0; warp_base < static_cast<int>(fibers.size()); warp_base += kWarp)
    released = release_warp(b, warp_base) || released;
  return released;
}

[[noreturn]] void deadlock(const Block& b) {
  std::ostringstream out;
  out << "deadlock in block (" << b.idx.x << "," << b.idx.y << "," << b.idx.z << "):";
  int shown = 0;
  for (const Fiber& f : *b.fibers) {
    if (f.state == State::kDone || shown == 8) continue;
    out << " thread " << f.linear << " waits at "
        << (f.state == State::kBlockBarrier ? "__syncthreads " : "a warp sync ") << where(f.site)
        << ";";
    ++shown;
  }
  out << " (a barrier some threads skip, or lanes that never reach their shuffle)";
  fail(b, out.str());
}

// Runs the block warp by warp, each as far as its shuffles and collectives take it before the
// next starts: warps drift apart between barriers as they may on the hardware, so a barrier
// missing between one warp's write and another warp's read of shared memory shows.
void run_block(Block& b) {
  std::vector<Fiber>& fibers = *b.fibers;
  const int n = static_cast<int>(fibers.size());
  for (;;) {
    bool ran = false;
    for (int warp_base = 0; warp_base < n; warp_base += kWarp) {
      for (;;) {
        bool any = false;
        for (int i = warp_base; i < std::min(n, warp_base + kWarp); ++i) {
          Fiber& f = fibers[i];
          if (f.state != State::kReady) continue;
          t_fiber = &f;
          switch_fiber(b.scheduler, f.context);
          t_fiber = nullptr;
          any = true;
          if (b.error) std::rethrow_exception(b.error);
        }
        ran = ran || any;
        if (!any || !release_warp(b, warp_base)) break;
      }
    }
    const bool all_done = std::all_of(fibers.begin(), fibers.end(),
                                      [](const Fiber& f) { return f.state == State::kDone; });
    if (all_done) return;
    if (!release(b) && !ran) deadlock(b);
  }
}

// Makes thread `i` of block `b` start the kernel body on `stack` (kStackBytes).
void start_fiber(Block& b, int i, char* stack) {
  Fiber& f = (*b.fibers)[i];
  AsyncCopies async = std::move(f.async);  // keeps the vectors' capacity from block to block
  async.copies.clear();
  async.group_ends.clear();
  f = Fiber{};
  f.async = std::move(async);
  f.linear = i;
  f.tid = uint3{static_cast<unsigned>(i) % b.dim.x, static_cast<unsigned>(i) / b.dim.x % b.dim.y,
                static_cast<unsigned>(i) / (b.dim.x * b.dim.y)};
  prepare_fiber(f.context, stack, kStackBytes, fiber_main);
}

void check_config(dim3 grid, dim3 block, std::size_t smem, int smem_limit, const char* name) {
  const auto threads = std::uint64_t{block.x} * block.y * block.z;
  std::string why;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) why = "empty grid";
  if (grid.x > 0x7fffffffu || grid.y > 65535u || grid.z > 65535u) why = "grid too large";
  if (threads == 0) why = "empty block";
  if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64) why = "block too large";
  if (smem > static_cast<std::size_t>(smem_limit)) {
    why = std::to_string(smem) + " bytes of dynamic shared memory exceed the kernel's limit of " +
          std::to_string(smem_limit) + " (cudaFuncSetAttribute raises it)";
  }
  if (!why.empty()) {
    throw SimtError(std::string("SIMT emulator: invalid launch of ") + name + " with grid (" +
                    std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
                    std::to_string(grid.z) + ") block (" + std::to_string(block.x) + "," +
                    std::to_string(block.y) + "," + std::to_string(block.z) + "): " + why);
  }
}

}  // namespace

const DeviceLimits& limits() {
  static const DeviceLimits l;
  return l;
}

void set_max_dynamic_shared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > limits().max_shared_optin) {
    throw SimtError("SIMT emulator: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " +
                    std::to_string(bytes) + ") exceeds the device's opt-in limit of " +
                    std::to_string(limits().max_shared_optin));
  }
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  smem_limits()[kernel] = bytes;
}

void check_launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, const void* kernel,
                  const char* name) {
  if (t_block != nullptr) throw SimtError("SIMT emulator: launch from inside a kernel");
  int smem_limit = limits().max_shared_default;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    if (auto it = smem_limits().find(kernel); it != smem_limits().end()) smem_limit = it->second;
  }
  check_config(grid, block, dynamic_shared_bytes, smem_limit, name);
}

void launch(dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, const void* kernel,
            const char* name, const std::function<void()>& thread_body) {
  check_launch(grid, block, dynamic_shared_bytes, kernel, name);

  const int n = static_cast<int>(block.x * block.y * block.z);
  std::vector<Fiber> fibers(n);
  // Fiber stacks stay with the OS thread from launch to launch: allocating (and faulting in)
  // a fresh 256 KiB per thread on every launch would cost more than most kernels.
  thread_local std::unique_ptr<char[]> t_stacks;
  thread_local int t_stack_count = 0;
  if (t_stack_count < n) {
    t_stacks.reset(new char[kStackBytes * static_cast<std::size_t>(n)]);  // touched lazily
    t_stack_count = n;
  }
  char* const stacks = t_stacks.get();
  const std::size_t smem_bytes = std::max<std::size_t>(dynamic_shared_bytes, 16);
  std::unique_ptr<float4[]> smem(new float4[(smem_bytes + 15) / 16]);

  Block b;
  b.name = name;
  b.grid = grid;
  b.dim = block;
  b.fibers = &fibers;
  b.body = &thread_body;
  b.dynamic_shared = smem.get();
  b.dynamic_shared_bytes = smem_bytes;
  b.slots.resize(n);
  b.exited.resize((n + kWarp - 1) / kWarp);

  struct Reset {  // t_block is cleared however the launch ends
    ~Reset() {
      t_block = nullptr;
      t_fiber = nullptr;
    }
  } reset;
  t_block = &b;
  ++g_launches;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        b.idx = uint3{bx, by, bz};
        std::fill(b.exited.begin(), b.exited.end(), 0);
        // Uninitialised shared memory reads as NaN (all bits set), so a kernel that reads what
        // it never wrote produces NaN instead of plausible numbers.
        std::memset(smem.get(), 0xff, smem_bytes);
        for (int i = 0; i < n; ++i)
          start_fiber(b, i, stacks + kStackBytes * static_cast<std::size_t>(i));
        run_block(b);
        g_threads += static_cast<std::uint64_t>(n);
      }
    }
  }
}

Stats stats() {
  return Stats{g_launches.load(), g_threads.load(), g_block_barriers.load(), g_warp_syncs.load(),
               g_warp_collectives.load()};
}

const uint3& thread_idx() {
  return t_fiber->tid;
}
const uint3& block_idx() {
  return t_block->idx;
}
const dim3& block_dim() {
  return t_block->dim;
}
const dim3& grid_dim() {
  return t_block->grid;
}

void syncthreads(const std::source_location& where) {
  if (t_fiber == nullptr) throw SimtError("SIMT emulator: __syncthreads() outside a kernel");
  wait(State::kBlockBarrier, where);
}

void* dynamic_shared() {
  return t_block->dynamic_shared;
}

bool in_dynamic_shared(const void* p, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(t_block->dynamic_shared);
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  return at >= begin && at + bytes <= begin + t_block->dynamic_shared_bytes;
}

AsyncCopies& async_copies() {
  if (t_fiber == nullptr) throw SimtError("SIMT emulator: cp.async outside a kernel");
  return t_fiber->async;
}

void thread_error(const std::string& what, const std::source_location& site) {
  fail(*t_block, thread_name(*t_block, *t_fiber) + " at " + where(site) + ": " + what);
}

}  // namespace zo::simt
