#include "pinned_memory/pinned_buffer.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#if defined(ZO_HAVE_CUDA) && ZO_HAVE_CUDA
#include <cuda_runtime_api.h>
#define ZO_PINNED_CUDA 1
#else
#define ZO_PINNED_CUDA 0
#endif

#include "core/bytes.h"

namespace zo::pinned {
namespace {

constexpr const char* kNoPinHint =
    "or pass --no-pin (PinOptions::enable = false) to use pageable memory without this warning";

// ---- warning sink -----------------------------------------------------------------------------

std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}

WarningSink& sink_slot() {
  static WarningSink sink;
  return sink;
}

// ---- /proc --------------------------------------------------------------------------------------

// The text after "<key>:" in /proc/self/status, trimmed; nullopt if absent.
std::optional<std::string> proc_status_field(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = key + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) != 0) continue;
    std::string value = line.substr(prefix.size());
    const auto first = value.find_first_not_of(" \t");
    return first == std::string::npos ? std::string{} : value.substr(first);
  }
  return std::nullopt;
}

// VmLck: memory this process has locked with mlock (and anything a driver charged to it).
std::size_t locked_bytes() {
  const std::optional<std::string> field = proc_status_field("VmLck");
  if (!field) return 0;
  std::istringstream fields(*field);
  unsigned long long kib = 0;
  return fields >> kib ? static_cast<std::size_t>(kib) * 1024 : 0;
}

// CAP_IPC_LOCK exempts a process from RLIMIT_MEMLOCK, but the kernel checks it against the
// initial user namespace: "root" in a rootless container shows the bit and is still limited.
bool exempt_from_memlock() {
  constexpr int kCapIpcLock = 14;
  const std::optional<std::string> caps = proc_status_field("CapEff");
  if (!caps) return false;
  unsigned long long mask = 0;
  if (std::sscanf(caps->c_str(), "%llx", &mask) != 1) return false;
  if ((mask >> kCapIpcLock & 1) == 0) return false;
  std::ifstream uid_map("/proc/self/uid_map");
  unsigned long long inside = 1, outside = 1, count = 0;
  if (!(uid_map >> inside >> outside >> count)) return false;
  std::string more;
  return inside == 0 && outside == 0 && count == 4294967295ull && !(uid_map >> more);
}

std::atomic<std::size_t> g_pinned_bytes{0};

std::size_t page_bytes() {
  const long v = ::sysconf(_SC_PAGESIZE);
  return v > 0 ? static_cast<std::size_t>(v) : std::size_t{4096};
}

// ---- CUDA ---------------------------------------------------------------------------------------

#if ZO_PINNED_CUDA
std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorString(err)) + " [" + cudaGetErrorName(err) + "]";
}
#endif

std::optional<std::string> compute_unavailable_reason() {
#if ZO_PINNED_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky, but leave no error behind for other callers
    return "no usable CUDA device (cudaGetDeviceCount: " + cuda_error_text(err) +
           "), so there is nothing to page-lock for; check the driver with `nvidia-smi`, " +
           kNoPinHint;
  }
  if (count == 0) {
    return std::string(
               "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and `nvidia-smi`), ") +
           kNoPinHint;
  }
  return std::nullopt;
#else
  return std::string(
      "this build has no CUDA support (configured without nvcc or with -DZO_CUDA=OFF), so there "
      "is nothing to page-lock for; pass --no-pin (PinOptions::enable = false) on the host "
      "backend to use pageable memory without this warning");
#endif
}

// Page-locks [data, data + bytes); nullopt on success, else the reason.
std::optional<std::string> register_pages(void* data, std::size_t bytes, bool portable) {
#if ZO_PINNED_CUDA
  const unsigned flags = portable ? cudaHostRegisterPortable : cudaHostRegisterDefault;
  const cudaError_t err = cudaHostRegister(data, bytes, flags);
  if (err == cudaSuccess) return std::nullopt;
  (void)cudaGetLastError();
  return "cudaHostRegister of " + format_bytes(bytes) + " (" + std::to_string(bytes) +
         " bytes) failed: " + cuda_error_text(err) +
         "; check the locked-memory limit (`ulimit -l`; raise it with `ulimit -l unlimited`) and "
         "free host memory, " +
         kNoPinHint;
#else
  (void)data;
  (void)bytes;
  (void)portable;
  return "this build has no CUDA support";  // unreachable: pin_unavailable_reason() says so first
#endif
}

// Whole pages covering a buffer, for madvise.
std::size_t page_span(std::size_t bytes) {
  const std::size_t page = page_bytes();
  return (bytes + page - 1) / page * page;
}

// Canonical sysfs form "dddd:bb:dd.f" (lower case, domain at least 4 digits), or nullopt for
// anything else; the check also keeps the id from escaping the sysfs directory.
std::optional<std::string> canonical_pci_id(std::string_view id) {
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.front())))
    id.remove_prefix(1);
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back())))
    id.remove_suffix(1);
  std::string text;
  for (const char c : id) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!std::isxdigit(static_cast<unsigned char>(lower)) && lower != ':' && lower != '.') {
      return std::nullopt;
    }
    text.push_back(lower);
  }
  std::string domain = "0000";
  std::string rest = text;
  if (std::count(text.begin(), text.end(), ':') == 2) {
    const auto colon = text.find(':');
    domain = text.substr(0, colon);
    rest = text.substr(colon + 1);
    // nvidia-smi prints 8 domain digits, sysfs at least 4 (VMD domains such as 10000 have 5).
    while (domain.size() > 4 && domain.front() == '0')
      domain.erase(0, 1);
    if (domain.size() < 4) domain = std::string(4 - domain.size(), '0') + domain;
  }
  // bus:device.function = "bb:dd.f"
  if (rest.size() != 7 || rest[2] != ':' || rest[5] != '.' || domain.empty() ||
      domain.find_first_of(":.") != std::string::npos) {
    return std::nullopt;
  }
  for (const std::size_t i : {0u, 1u, 3u, 4u, 6u}) {
    if (!std::isxdigit(static_cast<unsigned char>(rest[i]))) return std::nullopt;
  }
  return domain + ":" + rest;
}

}  // namespace

// ---- warnings -----------------------------------------------------------------------------------

WarningSink set_warning_sink(WarningSink sink) {
  const std::lock_guard<std::mutex> lock(sink_mutex());
  return std::exchange(sink_slot(), std::move(sink));
}

void emit_warning(const std::string& message) noexcept {
  try {
    WarningSink sink;
    {
      // Called outside the lock, so a sink may itself log or swap sinks.
      const std::lock_guard<std::mutex> lock(sink_mutex());
      sink = sink_slot();
    }
    if (sink) {
      sink(message);
    } else {
      std::fprintf(stderr, "warning: %s\n", message.c_str());
    }
  } catch (...) {  // a warning must never turn into an error
  }
}

// ---- pinning checks -----------------------------------------------------------------------------

std::optional<std::string> pin_precheck(std::size_t bytes, std::size_t memlock_limit,
                                        std::size_t mem_available, std::size_t already_locked) {
  if (memlock_limit != kUnlimited &&
      (bytes > memlock_limit || already_locked > memlock_limit - bytes)) {
    return "page-locking " + format_bytes(bytes) + " (" + std::to_string(bytes) +
           " bytes) would exceed the locked-memory limit RLIMIT_MEMLOCK (ulimit -l) of " +
           format_bytes(memlock_limit) + " (" + std::to_string(memlock_limit) + " bytes; " +
           std::to_string(already_locked) +
           " bytes already locked by this process); raise it with `ulimit -l unlimited` (Docker: "
           "--ulimit memlock=-1, systemd: LimitMEMLOCK=infinity), " +
           kNoPinHint;
  }
  if (mem_available != 0 && bytes > mem_available) {
    return "page-locking " + format_bytes(bytes) + " (" + std::to_string(bytes) +
           " bytes) is more than the host's MemAvailable of " + format_bytes(mem_available) + " (" +
           std::to_string(mem_available) +
           " bytes) and pinned pages cannot be swapped out; free host memory or use smaller "
           "buckets, " +
           kNoPinHint;
  }
  return std::nullopt;
}

std::size_t memlock_limit_bytes() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      exempt_from_memlock()) {
    return kUnlimited;
  }
  return static_cast<std::size_t>(
      std::min<rlim_t>(limit.rlim_cur, static_cast<rlim_t>(kUnlimited - 1)));
}

std::optional<std::string> pin_unavailable_reason() {
  static const std::optional<std::string> reason = compute_unavailable_reason();
  return reason;
}

std::size_t pinned_bytes_in_use() noexcept {
  return g_pinned_bytes.load(std::memory_order_relaxed);
}

// ---- NUMA placement near the GPU ----------------------------------------------------------------

int numa_node_of_gpu(std::string_view pci_bus_id, std::string_view sysfs_root) {
  const std::optional<std::string> id = canonical_pci_id(pci_bus_id);
  if (!id) return -1;
  std::ifstream in(std::string(sysfs_root) + "/bus/pci/devices/" + *id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node < 0 ? -1 : node;
}

int numa_node_of_gpu(int device) {
#if ZO_PINNED_CUDA
  if (device < 0 || pin_unavailable_reason()) return -1;
  char id[64] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return numa_node_of_gpu(std::string_view(id));
#else
  (void)device;
  return -1;
#endif
}

// ---- PinnedBuffer -------------------------------------------------------------------------------

PinnedBuffer::PinnedBuffer(std::size_t bytes, const PinOptions& options)
    : host_(bytes, options.placement) {
  if (bytes == 0) return;
  std::optional<std::string> reason;
  if (options.enable) {
    reason = pin_unavailable_reason();
    // Checked before first touch commits the pages, which would lower MemAvailable by `bytes`.
    // Current drivers do not charge VmLck for what they pin, so count our own pins too.
    if (!reason) {
      reason =
          pin_precheck(bytes, options.check_memlock ? memlock_limit_bytes() : kUnlimited,
                       host_available_bytes(), std::max(locked_bytes(), pinned_bytes_in_use()));
    }
  }
  if (options.first_touch_chunk_bytes > 0) host_.first_touch(options.first_touch_chunk_bytes);
  if (!options.enable) return;
  if (!reason) reason = register_pages(host_.data(), bytes, options.portable);
  if (!reason) {
    pinned_ = true;
    g_pinned_bytes.fetch_add(bytes, std::memory_order_relaxed);
    // A fork would make these pages copy-on-write in the parent, and the DMA engine would keep
    // using the pages the child got; keep them out of children (as RDMA stacks do).
    ::madvise(host_.data(), page_span(bytes), MADV_DONTFORK);
    return;
  }
  fallback_reason_ = *reason;
  if (options.warn) {
    emit_warning("pinned memory: " + fallback_reason_ + ". Using pageable memory for this " +
                 format_bytes(bytes) +
                 " buffer: host<->device copies through it are slower and do not overlap with "
                 "compute.");
  }
}

PinnedBuffer::~PinnedBuffer() {
  unpin();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : host_(std::move(other.host_)),
      pinned_(std::exchange(other.pinned_, false)),
      fallback_reason_(std::exchange(other.fallback_reason_, std::string{})) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    unpin();
    host_ = std::move(other.host_);
    pinned_ = std::exchange(other.pinned_, false);
    fallback_reason_ = std::exchange(other.fallback_reason_, std::string{});
  }
  return *this;
}

void PinnedBuffer::unpin() noexcept {
  if (!pinned_) return;
  pinned_ = false;
  g_pinned_bytes.fetch_sub(host_.size(), std::memory_order_relaxed);
#if ZO_PINNED_CUDA
  // Fails only when the runtime is already torn down (static destruction at exit), where the
  // driver releases the pages with the context anyway.
  if (cudaHostUnregister(host_.data()) != cudaSuccess) (void)cudaGetLastError();
#endif
}

}  // namespace zo::pinned
