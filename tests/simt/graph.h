// Stream capture and CUDA Graphs in the emulated runtime (cudart_fake.cpp, cudart_graph.cpp).
// Between cudaStreamBeginCapture and cudaStreamEndCapture (ThreadLocal mode) what is enqueued on
// the stream is recorded, not run, with its arguments as they were at the call, as CUDA records
// kernel parameters; cudaGraphLaunch replays the nodes in order as one item of the stream. Calls
// CUDA refuses while a thread captures (synchronisation, allocation, synchronous or pageable
// copies, waiting for an event from outside the capture) fail and break the capture, so that
// cudaStreamEndCapture reports cudaErrorStreamCaptureInvalidated. Captures are of one stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "streams.h"

namespace zo::simt {

// A recorded node: `make`, called on the launching thread at each cudaGraphLaunch, returns the
// work to run in the stream's order (an event record takes its generation at launch); `uses` is
// the memory it touches (streams.h).
struct GraphNode {
  std::function<std::function<void()>()> make;
  std::vector<Use> uses;
};

cudaError_t begin_capture(cudaStream_t stream);
// The recorded nodes; cudaErrorStreamCaptureInvalidated (and whatever was recorded) if a refused
// call broke the capture.
cudaError_t end_capture(cudaStream_t stream, std::vector<GraphNode>& nodes);
cudaStreamCaptureStatus capture_status(cudaStream_t stream);

// How many cudaGraphLaunch calls have been made so far (a test hook).
std::uint64_t graph_launches();

}  // namespace zo::simt
