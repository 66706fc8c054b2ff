// Page-locked host buffers for host<->device copies. A PinnedBuffer is a HostBuffer (NUMA-placed,
// optionally first-touched) that is then page-locked by the PageLocker its options carry: the GPU
// runtime's page-locking (cudaHostRegister from gpu/, plugged in by the trainer), so this library
// has no CUDA code. Where pinning is impossible (no locker, no GPU, RLIMIT_MEMLOCK, low
// MemAvailable, a driver refusal) or disabled (--no-pin), it stays ordinary pageable memory:
// copies still work, only slower and synchronous. The host backend uses the same classes with
// PinOptions::enable = false.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "pinned_memory/host_buffer.h"

namespace zo::pinned {

// ---- warnings -----------------------------------------------------------------------------------

// Receives one line of text per warning (no trailing newline). Called from whichever thread
// allocated; it must be thread-safe.
using WarningSink = std::function<void(const std::string&)>;

// Installs `sink` process-wide and returns the previous one; an empty sink restores the default,
// which writes "warning: <text>" to stderr. The trainer points this at its logger.
WarningSink set_warning_sink(WarningSink sink);

// Sends `message` through the current sink. Never throws (a throwing sink is ignored).
void emit_warning(const std::string& message) noexcept;

// ---- pinning checks -----------------------------------------------------------------------------

inline constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

// Why page-locking `bytes` more is refused, as a sentence naming the numbers and the fix, or
// nullopt if it fits. memlock_limit is the RLIMIT_MEMLOCK soft limit (kUnlimited for none),
// already_locked what this process holds locked already, mem_available MemAvailable (0 means
// unknown and skips that check): pinned pages cannot be swapped out, so pinning more than is
// available would push everything else out of RAM.
std::optional<std::string> pin_precheck(std::size_t bytes, std::size_t memlock_limit,
                                        std::size_t mem_available, std::size_t already_locked = 0);

// The RLIMIT_MEMLOCK soft limit in bytes; kUnlimited where it is RLIM_INFINITY or the process
// holds CAP_IPC_LOCK in the initial user namespace (which exempts it). Root in a container
// without that capability (Docker's default) is limited like anyone else.
std::size_t memlock_limit_bytes();

// How memory is page-locked for DMA, supplied by the GPU runtime (the CUDA one is gpu/'s
// page_lock_unavailable_reason, page_lock and page_unlock, gpu/runtime.h). Plain functions: a
// locker has no state and outlives every buffer. Empty (lock == nullptr) means nothing in this
// process page-locks memory.
struct PageLocker {
  // Why this process cannot page-lock at all (no usable GPU), or nullopt; may be null (never).
  std::optional<std::string> (*unavailable_reason)() = nullptr;
  // Page-locks [data, data + bytes) (`portable`: for every GPU context of the process); nullopt
  // on success, else why, as a sentence naming the numbers and what to check.
  std::optional<std::string> (*lock)(void* data, std::size_t bytes, bool portable) = nullptr;
  // Undoes lock(data, ...); never throws.
  void (*unlock)(void* data) noexcept = nullptr;
};

// Why a PinnedBuffer with this locker cannot pin at all (no locker, no usable GPU), ending in
// how to silence it (--no-pin), or nullopt when it can.
std::optional<std::string> pin_unavailable_reason(const PageLocker& locker);

// Bytes currently page-locked by PinnedBuffers in this process.
std::size_t pinned_bytes_in_use() noexcept;

// ---- NUMA placement near the GPU ----------------------------------------------------------------

// The NUMA node of the PCI device with this bus id (gpu::DeviceInfo::pci_bus_id for a GPU), read
// from <sysfs_root>/bus/pci/devices/<id>/numa_node. Accepts sysfs's form ("0000:3b:00.0"), CUDA's
// (cudaDeviceGetPCIBusId: "0000:3B:00.0") and nvidia-smi's ("00000000:3B:00.0"). Returns -1 when
// unknown: a malformed id, no such device, or firmware that reports no node.
int numa_node_of_gpu(std::string_view pci_bus_id, std::string_view sysfs_root = "/sys");

// Placement that binds pages to `node`, or first touch when node < 0 (unknown).
inline Placement placement_on_node(int node) {
  return node < 0 ? Placement{} : Placement{Placement::kNode, node};
}

// ---- PinnedBuffer -------------------------------------------------------------------------------

struct PinOptions {
  // false (--no-pin, or the host backend): plain pageable memory and no warning.
  bool enable = true;
  // What page-locks the memory; empty: nothing can, so enable gives a fallback warning.
  PageLocker locker{};
  // Where the pages go, e.g. placement_on_node(numa_node_of_gpu(pci_bus_id)). Pinning faults
  // every page in from the allocating thread, so under kFirstTouch they land on its node.
  Placement placement{};
  // > 0: HostBuffer::first_touch(first_touch_chunk_bytes) before pinning.
  std::size_t first_touch_chunk_bytes = 0;
  // Pinned for every GPU context in the process, not only the current device's (one process
  // driving several GPUs; cudaHostRegisterPortable).
  bool portable = false;
  // Refuse pinning beyond RLIMIT_MEMLOCK. Conservative: current NVIDIA drivers pin without
  // charging the limit, so false tries the locker regardless.
  bool check_memlock = true;
  // Emit the fallback warning (bench_copy turns it off: it measures pageable memory on purpose).
  bool warn = true;
};

// RAII, move-only owner of `size()` bytes of host memory, page-locked for DMA when is_pinned().
// The CUDA locker registers with the calling thread's current device (cudaSetDevice first).
class PinnedBuffer {
 public:
  PinnedBuffer() noexcept = default;
  // bytes == 0 gives an empty buffer. Throws what HostBuffer throws (HostMemoryError when the
  // memory itself cannot be had); failure to pin is never an error, only a fallback: then one
  // warning "<reason>; using pageable memory ..." goes through the sink (if options.warn).
  explicit PinnedBuffer(std::size_t bytes, const PinOptions& options = {});
  ~PinnedBuffer();  // unlocks, then unmaps; never throws

  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() noexcept { return host_.data(); }
  const void* data() const noexcept { return host_.data(); }
  std::size_t size() const noexcept { return host_.size(); }
  bool empty() const noexcept { return host_.empty(); }
  bool is_pinned() const noexcept { return unlock_ != nullptr; }
  // Why is_pinned() is false; empty when pinned, when empty(), or when disabled by the options.
  const std::string& fallback_reason() const noexcept { return fallback_reason_; }
  Placement placement() const noexcept { return host_.placement(); }
  const HostBuffer& host() const noexcept { return host_; }

  template <class T>
  std::span<T> span() {
    return host_.span<T>();
  }
  template <class T>
  std::span<const T> span() const {
    return host_.span<T>();
  }

 private:
  void unpin() noexcept;

  HostBuffer host_;
  void (*unlock_)(void*) noexcept = nullptr;  // non-null while pinned
  std::string fallback_reason_;
};

}  // namespace zo::pinned
