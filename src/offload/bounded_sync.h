// Waiting for a stream whose work includes collectives with other ranks: a rank that died or
// hangs would block the wait forever, so it is bounded by --comm-timeout; then the engine's
// stream collectives are aborted (the streams drain) and CommError is thrown. With one rank it is
// a plain synchronize.
#pragma once

#include <memory>
#include <vector>

#include "comm/stream_comm.h"
#include "core/serial_queue.h"
#include "device/device.h"

namespace zo::offload {

class BoundedSync {
 public:
  // comms: the stream communicators aborted on a timeout (empty with one rank).
  BoundedSync(dev::Device& device, int rank, int ranks, double timeout_s,
              std::vector<comm::StreamComm*> comms);
  // Blocks until everything enqueued on s so far is done and rethrows its errors; `what` names
  // the work in the timeout message ("the gradient reduce-scatter").
  void operator()(dev::Stream& s, const char* what);

 private:
  dev::Device& dev_;
  int rank_, ranks_;
  double timeout_s_;
  std::vector<comm::StreamComm*> comms_;
  std::unique_ptr<dev::Event> marker_;
};

// For destructors: waits until a worker thread and then a stream have finished what was queued
// (nothing may still touch the buffers about to be freed). Errors were reported by whoever
// waited on the step, or are moot while tearing down: never throws.
void finish_quietly(SerialQueue& worker, dev::Stream& stream) noexcept;

}  // namespace zo::offload
