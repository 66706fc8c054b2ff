// NCCL collectives for data parallelism on the CUDA backend (issue 6, docs/scale_out.md): the
// offload engine reduce-scatters gradient buckets and all-gathers parameter shards on its CUDA
// streams. The caller bootstraps: rank 0 makes a unique id, broadcasts it (over MPI), and every
// rank constructs an NcclComm from it.
#pragma once

#include <array>
#include <cstddef>

#include "core/dtype.h"

namespace zo::gpu {

inline constexpr std::size_t kNcclIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using NcclId = std::array<char, kNcclIdBytes>;

// Whether this build links NCCL (found next to the CUDA toolkit at configure time).
bool nccl_available();

class NcclComm {
 public:
  static NcclId unique_id();  // on one rank; throws if NCCL is missing
  // Joins the communicator of `size` ranks on CUDA device `device` (non-blocking init polled
  // until `timeout_s`; on timeout the communicator is aborted and a runtime_error says which
  // rank waited for what).
  NcclComm(const NcclId& id, int rank, int size, int device, double timeout_s);
  ~NcclComm();  // never throws
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Collectives return once NCCL has enqueued them on `stream` (polled within the timeout; on
  // timeout or error the communicator is aborted and a runtime_error thrown).
  // in (size * count) -> out (count), summed over ranks; on `stream` (a cudaStream_t).
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, void* stream);
  // in (count) -> out (size * count), rank order; on `stream`.
  void all_gather(const void* in, void* out, std::size_t count, DType dtype, void* stream);
  // ncclCommAbort: collectives in flight end (with an error) and later calls throw.
  void abort() noexcept;

 private:
  // After a collective returned `result` (an ncclResult_t): waits until NCCL has enqueued it
  // (non-blocking communicators may return ncclInProgress first), within the timeout.
  void enqueued(int result, const char* what);

  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 0;
};

}  // namespace zo::gpu
