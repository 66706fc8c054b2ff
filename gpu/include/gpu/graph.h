// CUDA Graphs: one stream's work recorded once and replayed as one launch, which saves the
// per-kernel launch cost (docs/gpu.md, "CUDA Graphs"). The work replays with the arguments it
// had when it was recorded (pointers, sizes, scalars): capture only work whose arguments repeat.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "gpu/runtime.h"

namespace zo::gpu {

class Graph {
 public:
  // Runs fn, which must enqueue its work on s alone, with s capturing (ThreadLocal mode: a
  // synchronisation, allocation or pageable copy from this thread fails the capture), and
  // instantiates what it recorded. Throws what fn threw, or CudaError when the capture broke; s
  // is no longer capturing either way. fn's work must have run once before on s (lazy setup such
  // as growing the stream's scratch or choosing GEMM algorithms cannot be captured).
  static Graph capture(Stream& s, const std::function<void()>& fn);

  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Replays the work on the stream it was captured on.
  void launch();
  // False once the stream's scratch has moved since the capture (the graph would use a freed
  // block): capture again.
  bool current() const { return stream_->scratch_epoch() == scratch_epoch_; }

 private:
  Graph(Stream& s, cudaGraphExec_t exec, std::uint64_t scratch_epoch)
      : stream_(&s), exec_(exec), scratch_epoch_(scratch_epoch) {}

  Stream* stream_;
  cudaGraphExec_t exec_ = nullptr;
  std::uint64_t scratch_epoch_;
};

}  // namespace zo::gpu
