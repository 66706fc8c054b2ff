// Large host arrays (fp32 master weights, Adam m and v) placed on NUMA nodes before their first
// touch. A HostBuffer is plain pageable memory; pinning it for DMA is a separate step.
#pragma once

#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace zo::pinned {

// Where the pages of a buffer go. Applied before any page is touched. Without NUMA support
// (numa_available() < 0) every policy degrades to kFirstTouch.
struct Placement {
  enum Policy {
    kFirstTouch,  // the kernel default: a page lands on the node of the thread that first writes it
    kNode,        // bind every page to `node`
    kInterleave,  // round-robin pages over all nodes this process may allocate on
  };
  Policy policy = kFirstTouch;
  int node = 0;  // for kNode
};

// RAII, move-only owner of `size()` bytes of anonymous, page-aligned host memory (2 MiB-aligned
// and advised for transparent huge pages from 2 MiB up). Pages are not touched by the
// constructor, so no physical memory is committed until first written: by first_touch() or by
// whoever writes the data.
class HostBuffer {
 public:
  HostBuffer() noexcept = default;
  // bytes == 0 gives an empty buffer. Throws HostMemoryError if the host cannot map the
  // memory, std::invalid_argument for a node that does not exist.
  explicit HostBuffer(std::size_t bytes, Placement placement = {});
  ~HostBuffer();

  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // A buffer of `count` elements of T. first_touch_chunk_elements > 0 also runs
  // first_touch(first_touch_chunk_elements * sizeof(T)), e.g. zo::cpu_adam::kChunkElements.
  template <class T>
  static HostBuffer allocate_array(std::size_t count, Placement placement = {},
                                   std::size_t first_touch_chunk_elements = 0);

  void* data() noexcept { return data_; }
  const void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  // The policy in effect: the requested one, or kFirstTouch where NUMA is unavailable or the
  // kernel refused the policy (mbind is blocked in some containers).
  Placement placement() const noexcept { return placement_; }

  // The buffer as size() / sizeof(T) elements; throws if size() is not a multiple of sizeof(T).
  template <class T>
  std::span<T> span();
  template <class T>
  std::span<const T> span() const;

  // Zero-fills the buffer in chunks of chunk_bytes (the last one may be shorter) with a
  // tbb::parallel_for over chunk indices using tbb::static_partitioner, in the calling task
  // arena. A loop over the same chunks with the same partitioner in the same arena (the CPU
  // Adam's) runs chunk k on the same worker, so under kFirstTouch each page lands on the node
  // of the thread that will update it. Throws std::invalid_argument if chunk_bytes == 0.
  void first_touch(std::size_t chunk_bytes);

 private:
  void release() noexcept;
  void check_element_size(std::size_t element_bytes) const;  // throws std::logic_error

  void* data_ = nullptr;
  std::size_t size_ = 0;    // bytes requested
  std::size_t mapped_ = 0;  // bytes mapped (whole pages), for munmap
  Placement placement_{};
};

// MemAvailable from /proc/meminfo in bytes (the kernel's estimate of what can be allocated
// without swapping); falls back to free physical pages where /proc is unreadable.
std::size_t host_available_bytes();

// NUMA nodes this process may allocate memory on; 1 when NUMA is unavailable.
int numa_node_count();

// Runs the calling thread, and the threads it creates from now on, on the CPUs of NUMA `node`,
// unless the process is already restricted to a subset of the machine's CPUs (a launcher such
// as `mpirun --bind-to` or numactl decided). Returns whether it bound; false also when NUMA is
// unavailable or node < 0.
bool run_near_node(int node);

// For tests and diagnostics: the NUMA node of every page overlapping [p, p + bytes), or a
// negative errno for a page that is not resident (-ENOENT) or not mapped (-EFAULT).
// Does not fault pages in.
std::vector<int> page_nodes(const void* p, std::size_t bytes);

// ---- templates ----------------------------------------------------------------------------------

template <class T>
HostBuffer HostBuffer::allocate_array(std::size_t count, Placement placement,
                                      std::size_t first_touch_chunk_elements) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "HostBuffer holds raw bytes: T must be trivially copyable and destructible");
  if (count > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
    throw std::invalid_argument("HostBuffer::allocate_array: " + std::to_string(count) +
                                " elements of " + std::to_string(sizeof(T)) +
                                " bytes overflow size_t");
  }
  HostBuffer buffer(count * sizeof(T), placement);
  if (first_touch_chunk_elements > 0) {
    const std::size_t max_chunk = std::numeric_limits<std::size_t>::max() / sizeof(T);
    buffer.first_touch(first_touch_chunk_elements > max_chunk
                           ? std::numeric_limits<std::size_t>::max()
                           : first_touch_chunk_elements * sizeof(T));
  }
  return buffer;
}

template <class T>
std::span<T> HostBuffer::span() {
  static_assert(std::is_trivially_copyable_v<T>, "T must be trivially copyable");
  check_element_size(sizeof(T));
  return {static_cast<T*>(data_), size_ / sizeof(T)};
}

template <class T>
std::span<const T> HostBuffer::span() const {
  static_assert(std::is_trivially_copyable_v<T>, "T must be trivially copyable");
  check_element_size(sizeof(T));
  return {static_cast<const T*>(data_), size_ / sizeof(T)};
}

}  // namespace zo::pinned
