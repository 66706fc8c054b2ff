#include "pinned_memory/host_buffer.h"

#include "core/bytes.h"

#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

namespace zo::pinned {
namespace {

// Transparent huge pages back only 2 MiB-aligned extents; large buffers are aligned to this.
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

std::size_t page_bytes() {
  static const std::size_t bytes = [] {
    const long v = ::sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<std::size_t>(v) : std::size_t{4096};
  }();
  return bytes;
}

// Rounds up to a multiple of `align` (a power of two); nullopt on overflow.
std::optional<std::size_t> round_up(std::size_t n, std::size_t align) {
  if (n > std::numeric_limits<std::size_t>::max() - (align - 1)) return std::nullopt;
  return (n + align - 1) & ~(align - 1);
}

// A field of /proc/meminfo ("MemAvailable", "MemTotal", ...) in bytes.
std::optional<std::size_t> meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) != 0) continue;
    std::istringstream fields(line.substr(prefix.size()));
    unsigned long long kib = 0;
    if (fields >> kib) return static_cast<std::size_t>(kib) * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

[[noreturn]] void throw_out_of_memory(std::size_t requested, const std::string& reason) {
  const std::size_t available = host_available_bytes();
  std::ostringstream facts;
  facts << "cannot allocate " << requested << " bytes (" << format_bytes(requested)
        << ") of host memory: " << reason << "; MemAvailable is " << available << " bytes ("
        << format_bytes(available) << ").";
  // Training's advice; sample and eval replace it with their own (HostMemoryError::facts).
  throw HostMemoryError(facts.str() +
                            " Use a smaller model, keep the optimizer state in bf16, or run on a "
                            "host with more RAM.",
                        requested, available, facts.str());
}

bool numa_usable() {
  // numa_available() queries the kernel once per call; the answer cannot change in a process.
  static const bool usable = ::numa_available() >= 0;
  return usable;
}

struct NodemaskDeleter {
  void operator()(bitmask* mask) const noexcept { ::numa_free_nodemask(mask); }
};
using Nodemask = std::unique_ptr<bitmask, NodemaskDeleter>;

// Rejects a node this process cannot allocate on, before anything is mapped.
void validate_placement(const Placement& placement) {
  if (placement.policy != Placement::kFirstTouch && placement.policy != Placement::kNode &&
      placement.policy != Placement::kInterleave) {
    throw std::invalid_argument("HostBuffer: unknown Placement::Policy " +
                                std::to_string(static_cast<int>(placement.policy)));
  }
  if (placement.policy != Placement::kNode) return;
  if (placement.node < 0) {
    throw std::invalid_argument("HostBuffer: Placement::kNode needs a node >= 0, got " +
                                std::to_string(placement.node));
  }
  if (!numa_usable()) return;  // degrades to first touch
  const Nodemask allowed(::numa_get_mems_allowed());
  if (placement.node > ::numa_max_node() ||
      !::numa_bitmask_isbitset(allowed.get(), static_cast<unsigned>(placement.node))) {
    throw std::invalid_argument(
        "HostBuffer: NUMA node " + std::to_string(placement.node) +
        " does not exist or is not allowed for this process (highest node is " +
        std::to_string(::numa_max_node()) +
        "); pick a node listed by `numactl --hardware`, or use Placement::kFirstTouch");
  }
}

// Sets the memory policy of untouched pages. Returns the policy in effect: where the kernel
// refuses (seccomp in containers blocks mbind without CAP_SYS_NICE) placement is a lost
// optimisation, not an error, so it degrades to first touch.
Placement apply_placement(void* addr, std::size_t len, const Placement& placement) {
  if (placement.policy == Placement::kFirstTouch || !numa_usable()) return {};
  Nodemask mask;
  int mode = 0;
  if (placement.policy == Placement::kNode) {
    mask.reset(::numa_allocate_nodemask());
    ::numa_bitmask_setbit(mask.get(), static_cast<unsigned>(placement.node));
    mode = MPOL_BIND;
  } else {
    mask.reset(::numa_get_mems_allowed());
    mode = MPOL_INTERLEAVE;
  }
  // maxnode counts bits plus one, as libnuma itself passes it.
  if (::mbind(addr, len, mode, mask->maskp, mask->size + 1, 0) != 0) return {};
  return placement;
}

}  // namespace

// ---- HostBuffer ---------------------------------------------------------------------------------

HostBuffer::HostBuffer(std::size_t bytes, Placement placement) {
  validate_placement(placement);
  if (bytes == 0) return;

  const std::optional<std::size_t> mapped = round_up(bytes, page_bytes());
  if (!mapped) throw_out_of_memory(bytes, "the size overflows the address space");
  // Memory that RAM plus swap can never hold would only die later in the OOM killer (with
  // overcommit enabled mmap accepts it), so refuse it here.
  const std::optional<std::size_t> total = meminfo_bytes("MemTotal");
  const std::size_t swap = meminfo_bytes("SwapTotal").value_or(0);
  if (total && bytes > *total && bytes - *total > swap) {
    throw_out_of_memory(
        bytes, "more than the host's RAM plus swap (" + std::to_string(*total + swap) + " bytes)");
  }

  const bool huge = *mapped >= kHugePageBytes;
  // Over-map by one huge page so the start can be moved to a 2 MiB boundary.
  const std::size_t reserve = huge ? *mapped + kHugePageBytes : *mapped;
  if (reserve < *mapped) throw_out_of_memory(bytes, "the size overflows the address space");
  void* raw = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    std::string reason = std::string("mmap: ") + std::strerror(err);
    // Refused although the RAM is there: a per-process limit, not the machine, is the cause.
    if (host_available_bytes() >= bytes) {
      reason +=
          " (MemAvailable would cover it: check `ulimit -v`, the container's memory limit "
          "and vm.overcommit_memory)";
    }
    throw_out_of_memory(bytes, reason);
  }

  auto* base = static_cast<std::byte*>(raw);
  std::byte* start = base;
  if (huge) {
    const auto addr = reinterpret_cast<std::uintptr_t>(base);
    start = base + (round_up(addr, kHugePageBytes).value() - addr);
    const std::size_t head = static_cast<std::size_t>(start - base);
    const std::size_t tail = reserve - head - *mapped;
    if (head > 0) ::munmap(base, head);
    if (tail > 0) ::munmap(start + *mapped, tail);
    ::madvise(start, *mapped, MADV_HUGEPAGE);  // best effort: THP may be disabled
  }

  data_ = start;
  size_ = bytes;
  mapped_ = *mapped;
  placement_ = apply_placement(data_, mapped_, placement);
}

HostBuffer::~HostBuffer() {
  release();
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      placement_(std::exchange(other.placement_, Placement{})) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    placement_ = std::exchange(other.placement_, Placement{});
  }
  return *this;
}

void HostBuffer::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, mapped_);  // cannot fail for a mapping we own
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  placement_ = Placement{};
}

void HostBuffer::check_element_size(std::size_t element_bytes) const {
  if (size_ % element_bytes != 0) {
    throw std::logic_error("HostBuffer::span: " + std::to_string(size_) +
                           " bytes is not a whole number of " + std::to_string(element_bytes) +
                           "-byte elements");
  }
}

void HostBuffer::first_touch(std::size_t chunk_bytes) {
  if (chunk_bytes == 0) {
    throw std::invalid_argument(
        "HostBuffer::first_touch: chunk_bytes must be > 0 (the optimizer's chunk, e.g. "
        "zo::cpu_adam::kChunkElements * sizeof(float))");
  }
  if (size_ == 0) return;
  const std::size_t chunks = size_ / chunk_bytes + (size_ % chunk_bytes != 0 ? 1 : 0);
  auto* bytes = static_cast<std::byte*>(data_);
  // Grain size 1 and the static partitioner: the chunk -> worker map depends only on the chunk
  // count and the arena's concurrency, exactly as in the optimizer's loop.
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, chunks, 1),
      [&](const tbb::blocked_range<std::size_t>& range) {
        for (std::size_t k = range.begin(); k != range.end(); ++k) {
          const std::size_t begin = k * chunk_bytes;
          std::memset(bytes + begin, 0, std::min(chunk_bytes, size_ - begin));
        }
      },
      tbb::static_partitioner{});
}

// ---- free functions -----------------------------------------------------------------------------

std::size_t host_available_bytes() {
  if (const std::optional<std::size_t> available = meminfo_bytes("MemAvailable")) {
    return *available;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  return pages > 0 ? static_cast<std::size_t>(pages) * page_bytes() : 0;
}

int numa_node_count() {
  if (!numa_usable()) return 1;
  return std::max(1, ::numa_num_task_nodes());
}

bool run_near_node(int node) {
  if (node < 0 || !numa_usable() || node > ::numa_max_node()) return false;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return false;
  if (CPU_COUNT(&mask) < ::numa_num_configured_cpus()) return false;  // someone bound us already
  return ::numa_run_on_node(node) == 0;
}

std::vector<int> page_nodes(const void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return {};
  const std::size_t page = page_bytes();
  const auto first = reinterpret_cast<std::uintptr_t>(p) & ~(page - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(p) + bytes;
  const std::size_t count = (end - first + page - 1) / page;
  std::vector<int> nodes(count, -ENOENT);

  // move_pages with nodes == nullptr only reports: the node, -ENOENT (not resident) or -EFAULT.
  constexpr std::size_t kBatch = 4096;
  std::vector<void*> addrs;
  bool queried = true;
  for (std::size_t i = 0; i < count && queried; i += kBatch) {
    const std::size_t n = std::min(kBatch, count - i);
    addrs.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      addrs[j] = reinterpret_cast<void*>(first + (i + j) * page);
    }
    queried = ::move_pages(0, n, addrs.data(), nullptr, nodes.data() + i, 0) == 0;
  }
  if (queried) return nodes;

  // move_pages refused (seccomp, no NUMA kernel): residency from mincore, which never faults a
  // page in, and the node from get_mempolicy only for resident pages (it would fault them in).
  for (std::size_t i = 0; i < count; ++i) {
    void* addr = reinterpret_cast<void*>(first + i * page);
    unsigned char resident = 0;
    if (::mincore(addr, page, &resident) != 0) {
      nodes[i] = -EFAULT;
    } else if ((resident & 1) == 0) {
      nodes[i] = -ENOENT;
    } else if (!numa_usable()) {
      nodes[i] = 0;  // without NUMA all memory is one node
    } else {
      int node = 0;
      nodes[i] =
          ::get_mempolicy(&node, nullptr, 0, addr, MPOL_F_NODE | MPOL_F_ADDR) == 0 ? node : -errno;
    }
  }
  return nodes;
}

}  // namespace zo::pinned
