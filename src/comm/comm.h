// Collective communication between the ranks of a data-parallel job (see
// docs/scale_out.md). This first layer is host-side and blocking: small collectives for
// norms, flags and config checks, and the reduce-scatter / all-gather the host backend's data
// parallelism uses. Collectives on device streams (MPI on host-backend stream threads, NCCL on
// CUDA streams bootstrapped through broadcast() here) are in comm/stream_comm.h.
//
// Every call is collective: all ranks call it in the same order with the same sizes. A call that
// does not complete within the communicator's timeout throws CommError on the ranks that wait
// (a rank died or the ranks diverged), so a job never hangs forever.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace zo::comm {

// Where this process sits in the job: from mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
// _LOCAL_SIZE), else from ZO_RANK, ZO_WORLD_SIZE, ZO_LOCAL_RANK, ZO_LOCAL_SIZE, else a single
// process. Throws std::invalid_argument for malformed or inconsistent values, naming them.
struct RankInfo {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string source = "single process";  // "mpirun", "environment" or "single process"
};
RankInfo rank_info_from_env();

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  virtual std::string name() const = 0;  // "single process", "MPI (OpenMPI 4.1.4)", ...

  // data (n) on every rank := op over ranks of data.
  virtual void all_reduce(double* data, std::size_t n, ReduceOp op) = 0;
  virtual void all_reduce(float* data, std::size_t n, ReduceOp op) = 0;
  // in (size * count) on every rank; out (count) := sum over ranks of in[rank() * count, +count).
  virtual void reduce_scatter(const float* in, float* out, std::size_t count) = 0;
  // in (bytes) on every rank; out (size * bytes) := every rank's in, in rank order.
  virtual void all_gather(const void* in, void* out, std::size_t bytes) = 0;
  // data (bytes) on every rank := root's data.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // A new communicator over the same ranks with its own ordering of collectives (collective
  // call). Threads that issue collectives concurrently (the engine's gradient and parameter
  // streams) each use their own, so the ranks always agree on the order within each.
  virtual std::unique_ptr<Communicator> duplicate() = 0;
};

// A communicator of one rank: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_single_process_comm();

// Whether this build has MPI (Debian's OpenMPI, found by CMake).
bool mpi_available();
// An MPI communicator over MPI_COMM_WORLD (initialising MPI on first use, once per process).
// Collectives time out after `timeout_s` seconds. Throws CommError without MPI in the build.
std::unique_ptr<Communicator> make_mpi_comm(double timeout_s = 300.0);
// MPI when the process was started by mpirun (or ZO_WORLD_SIZE > 1), else single process.
std::unique_ptr<Communicator> make_comm_from_env(double timeout_s = 300.0);

// Every rank passes its own `fingerprint` of `what` (e.g. the resolved config as JSON); throws
// std::invalid_argument on every rank if they differ, naming the first rank that differs from
// rank 0 and both values (abbreviated), then "; <fix>".
void check_same_on_all_ranks(Communicator& c, const std::string& what,
                             const std::string& fingerprint,
                             const std::string& fix = "start every rank with the same flags");

// Ends every rank of the job now (MPI_Abort) when this process is part of an MPI job; returns
// otherwise. For a rank that found the job broken (a CommError): the others may be blocked in
// collectives or in MPI_Finalize waiting for it. Never throws.
void abort_job(int exit_code) noexcept;

// `root`'s string on every rank (`mine` is read on root only).
std::string broadcast_string(Communicator& c, const std::string& mine, int root);

}  // namespace zo::comm
