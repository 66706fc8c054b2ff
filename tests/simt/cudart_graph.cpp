// CUDA Graphs of the emulated runtime (graph.h): a graph is the node list of one stream's
// capture; an executable graph a copy of it, launched as one stream item.
#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "graph.h"
#include "streams.h"

struct CUgraph_st {
  std::vector<zo::simt::GraphNode> nodes;
};

struct CUgraphExec_st {
  std::vector<zo::simt::GraphNode> nodes;
};

namespace {
std::atomic<std::uint64_t> g_launches{0};
}  // namespace

namespace zo::simt {
std::uint64_t graph_launches() {
  return g_launches.load();
}
}  // namespace zo::simt

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  // Global and Relaxed modes would change which threads' calls are refused; the project uses
  // ThreadLocal only.
  if (mode != cudaStreamCaptureModeThreadLocal) return cudaErrorInvalidValue;
  return zo::simt::begin_capture(stream);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  std::vector<zo::simt::GraphNode> nodes;
  const cudaError_t e = zo::simt::end_capture(stream, nodes);
  if (e == cudaSuccess) *graph = new CUgraph_st{std::move(nodes)};
  return e;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return cudaErrorInvalidValue;
  *status = zo::simt::capture_status(stream);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  if (zo::simt::capture_status(stream) != cudaStreamCaptureStatusNone) return cudaErrorInvalidValue;
  auto work = std::make_shared<std::vector<std::function<void()>>>();
  work->reserve(exec->nodes.size());
  std::vector<zo::simt::Use> uses;
  for (const auto& node : exec->nodes) {
    work->push_back(node.make());
    uses.insert(uses.end(), node.uses.begin(), node.uses.end());
  }
  ++g_launches;
  zo::simt::enqueue(
      stream,
      [work] {
        for (const auto& w : *work)
          w();
      },
      std::move(uses), "a graph launch");
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

// Launched work holds its own copy of the nodes: destroying the executable graph at once is safe,
// as in CUDA.
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

}  // extern "C"
