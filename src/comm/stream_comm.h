// Collectives on device memory, enqueued on a device stream like any other op (issue 6,
// docs/scale_out.md): the offload engine reduce-scatters gradient buckets on its gradient stream
// and all-gathers parameter shards on its upload stream, so both overlap compute.
//
// On the host backend a collective is a task on the stream's worker thread that calls an MPI
// communicator owned by this object (one per stream: the ranks then agree on the order of the
// collectives within each). On CUDA it is NCCL on the CUDA stream (gpu/nccl_comm.h), its
// communicator bootstrapped by broadcasting the unique id over MPI.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/comm.h"
#include "core/dtype.h"
#include "device/device.h"

namespace zo::comm {

class StreamComm {
 public:
  virtual ~StreamComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // in (size * count) device memory on every rank; out (count) := sum over ranks of
  // in[rank * count, +count). in and out must not overlap.
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                              dev::Stream& s) = 0;
  // in (count) on every rank; out (size * count) := every rank's in, in rank order. in and out
  // must not overlap.
  virtual void all_gather(const void* in, void* out, std::size_t count, DType dtype,
                          dev::Stream& s) = 0;
  // Ends collectives that will never complete (another rank died or hangs) so that the streams
  // waiting on them drain; the communicator is unusable afterwards. Never throws.
  virtual void abort() noexcept = 0;
};

// For `device`'s streams: takes a fresh communicator from `parent` (collective call: every rank
// makes its stream communicators in the same order). Host backend: MPI (or the single-process
// copy) on the stream's thread, fp32 only; CUDA backend: NCCL, its initialisation bounded by
// timeout_s.
std::unique_ptr<StreamComm> make_stream_comm(dev::Device& device, Communicator& parent,
                                             double timeout_s = 300.0);

}  // namespace zo::comm
