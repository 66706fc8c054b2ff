#include "gpu/nccl_comm.h"

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
  if (r == ncclSuccess || r == ncclInProgress) return;
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
    : rank_(rank), size_(size) {
  ZO_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId nid;
  std::copy(id.begin(), id.end(), nid.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init returns at once; polled below against the deadline
  ncclComm_t comm = nullptr;
  check(ncclCommInitRankConfig(&comm, size, nid, rank, &config), "ncclCommInitRankConfig");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError", comm);
    if (state != ncclInProgress) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw std::runtime_error("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                               ": NCCL initialisation did not complete within " +
                               std::to_string(int(timeout_s)) +
                               " s: another rank has died or cannot reach this one");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm);
    check(state, "NCCL initialisation");
  }
  comm_ = comm;
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
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
  check(ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, c,
                          static_cast<cudaStream_t>(stream)),
        "ncclReduceScatter", c);
}

void NcclComm::all_gather(const void* in, void* out, std::size_t count, DType dtype, void* stream) {
  ncclComm_t c = live(comm_);
  check(ncclAllGather(in, out, count, nccl_type(dtype), c, static_cast<cudaStream_t>(stream)),
        "ncclAllGather", c);
}

#endif

}  // namespace zo::gpu
