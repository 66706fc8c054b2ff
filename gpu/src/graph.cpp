#include "gpu/graph.h"

#include <utility>

#include "gpu/check.h"

namespace zo::gpu {
namespace {

// Ends a capture that fn left by throwing; the partial graph is dropped.
void abandon_capture(cudaStream_t s) noexcept {
  cudaGraph_t partial = nullptr;
  if (cudaStreamEndCapture(s, &partial) == cudaSuccess && partial != nullptr)
    (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
}

}  // namespace

Graph Graph::capture(Stream& s, const std::function<void()>& fn) {
  const DeviceGuard guard(s.device());
  const std::uint64_t epoch = s.scratch_epoch();
  ZO_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  try {
    fn();
  } catch (...) {
    abandon_capture(s.get());
    throw;
  }
  cudaGraph_t graph = nullptr;
  ZO_CUDA_CHECK(cudaStreamEndCapture(s.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  ZO_CUDA_CHECK(status);
  return Graph(s, exec, epoch);
}

Graph::~Graph() {
  if (exec_ == nullptr) return;
  const QuietDeviceGuard guard(stream_->device());
  (void)cudaGraphExecDestroy(exec_);  // launched work still completes
  (void)cudaGetLastError();
}

Graph::Graph(Graph&& other) noexcept
    : stream_(other.stream_),
      exec_(std::exchange(other.exec_, nullptr)),
      scratch_epoch_(other.scratch_epoch_) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    Graph old(std::move(*this));
    stream_ = other.stream_;
    exec_ = std::exchange(other.exec_, nullptr);
    scratch_epoch_ = other.scratch_epoch_;
  }
  return *this;
}

void Graph::launch() {
  const DeviceGuard guard(stream_->device());
  ZO_CUDA_CHECK(cudaGraphLaunch(exec_, stream_->get()));
}

}  // namespace zo::gpu
