#include "gpu/nccl_comm.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "gpu/check.h"

#ifdef ZO_HAVE_NCCL
#include <nccl.h>
#endif

namespace zo::gpu {

#ifndef ZO_HAVE_NCCL

bool nccl_available() {
  return false;
}
NcclId NcclComm::unique_id() {
  throw std::runtime_error(
      "this build has no NCCL (libnccl next to the CUDA toolkit); data parallelism on the GPU "
      "needs it: install NCCL and re-run cmake, or train data-parallel with --device host");
}
NcclComm::NcclComm(const NcclId&, int, int, int, double) {
  unique_id();
}
NcclComm::~NcclComm() = default;
void NcclComm::reduce_scatter(const void*, void*, std::size_t, DType, void*) {}
void NcclComm::all_gather(const void*, void*, std::size_t, DType, void*) {}
void NcclComm::abort() noexcept {}

#else

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclIdBytes);

void check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  }
  throw std::runtime_error(msg);
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
  }
  throw std::invalid_argument("NCCL: unsupported dtype");
}

// A call on a non-blocking communicator (config.blocking = 0) may return ncclInProgress: its work
// is not yet enqueued on the stream, and NCCL allows no other call on the communicator and no
// dependent stream work until ncclCommGetAsyncError reports ncclSuccess. Polls until then or
// `timeout_s`; on timeout or error the communicator is aborted and a runtime_error says why.
void wait_ready(ncclComm_t comm, const char* what, double timeout_s, int rank, int size) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  ncclResult_t state = ncclInProgress;
  for (int polls = 0;; ++polls) {
    const ncclResult_t polled = ncclCommGetAsyncError(comm, &state);
    if (polled != ncclSuccess) state = polled;
    if (state != ncclInProgress) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw std::runtime_error("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                               ": " + what + " did not complete within " +
                               std::to_string(int(timeout_s)) +
                               " s: another rank has died or cannot reach this one");
    }
    // Collectives are usually enqueued within microseconds; initialisation can take seconds.
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  if (state != ncclSuccess) {
    std::string msg = std::string(what) + " failed: " + ncclGetErrorString(state);
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
    ncclCommAbort(comm);
    throw std::runtime_error(msg);
  }
}

}  // namespace

bool nccl_available() {
  return true;
}

NcclId NcclComm::unique_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclId out;
  std::copy(id.internal, id.internal + kNcclIdBytes, out.begin());
  return out;
}

NcclComm::NcclComm(const NcclId& id, int rank, int size, int device, double timeout_s)
    : rank_(rank), size_(size), timeout_s_(timeout_s) {
  ZO_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId nid;
  std::copy(id.begin(), id.end(), nid.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init returns at once; polled below against the deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, size, nid, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    check(started, "ncclCommInitRankConfig");
  }
  wait_ready(comm, "NCCL initialisation", timeout_s, rank, size);
  comm_ = comm;
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  auto comm = static_cast<ncclComm_t>(comm_);
  // A non-blocking communicator flushes its work in ncclCommFinalize, which may return
  // ncclInProgress; destroy it only once that is done, abort it if finalizing fails.
  const ncclResult_t r = ncclCommFinalize(comm);
  if (r != ncclSuccess && r != ncclInProgress) {
    ncclCommAbort(comm);
    return;
  }
  try {
    wait_ready(comm, "ncclCommFinalize", timeout_s_, rank_, size_);
  } catch (...) {
    return;  // wait_ready aborted the communicator
  }
  ncclCommDestroy(comm);
}

void NcclComm::abort() noexcept {
  if (comm_ != nullptr) ncclCommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

namespace {
ncclComm_t live(void* c) {
  if (c == nullptr) throw std::runtime_error("NCCL communicator used after it was aborted");
  return static_cast<ncclComm_t>(c);
}
}  // namespace

void NcclComm::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                              void* stream) {
  ncclComm_t c = live(comm_);
  enqueued(ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, c,
                             static_cast<cudaStream_t>(stream)),
           "ncclReduceScatter");
}

void NcclComm::all_gather(const void* in, void* out, std::size_t count, DType dtype, void* stream) {
  ncclComm_t c = live(comm_);
  enqueued(ncclAllGather(in, out, count, nccl_type(dtype), c, static_cast<cudaStream_t>(stream)),
           "ncclAllGather");
}

void NcclComm::enqueued(int result, const char* what) {
  auto c = static_cast<ncclComm_t>(comm_);
  const auto r = static_cast<ncclResult_t>(result);
  if (r != ncclSuccess && r != ncclInProgress) check(r, what, c);
  try {
    // Also after ncclSuccess: cheap, and it surfaces asynchronous errors at the call.
    wait_ready(c, what, timeout_s_, rank_, size_);
  } catch (...) {
    comm_ = nullptr;  // aborted by wait_ready
    throw;
  }
}

#endif

}  // namespace zo::gpu
