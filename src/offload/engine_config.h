// The offload engine's settings, the bucket plan and optimizer partition it implies, and the
// memory it allocates (the planner's numbers are these, not estimates).
#pragma once

#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "model/layout.h"
#include "offload/bucket_plan.h"
#include "optim/host_optimizer.h"

namespace zo::offload {

struct EngineConfig {
  // Gradient bytes per bucket (act dtype). 32 MiB: large enough that a copy runs at full PCIe
  // bandwidth, small enough that the last bucket's copy adds little after backward.
  std::size_t bucket_bytes = std::size_t{32} << 20;
  int grad_accum = 1;  // micro-batches per step; > 1 sums them in fp32 (below)
  // grad_accum > 1: sum the micro-batches in an fp32 buffer on the device (this rank's shards)
  // and send the sum, rounded once to the act dtype, at the last micro-batch: one bucket per step
  // crosses PCIe. Off: every micro-batch's buckets go to the host and are summed there in fp32.
  bool accumulate_on_device = false;
  bool pin = true;             // page-lock host staging buffers (off: pageable, copies not async)
  int device_slots = 3;        // device ring of bucket-sized gradient slots (>= 2)
  int host_slots = 4;          // pinned ring for host accumulation
  bool dpu = false;            // allocate for delayed updates (begin_step(true) delays a step)
  int ranks = 1, rank = 0;     // data parallel: the job's ranks and this one
  DType master = DType::kF32;  // the host optimizer's master weights (uploads read them)
  // The optimizer state is on a drive (--state-dir): uploads read a copy of the parameters in
  // host memory, whatever the master's dtype.
  bool state_on_drive = false;
  // Stream mode (param_window.h): > 0 keeps only the embeddings, the final group and this many
  // slots (>= 2) of blocks on the device; one rank, no DPU. poison_window fills each slot with
  // NaN before it takes a new group (a test and debug switch).
  int param_window = 0;
  bool poison_window = false;
  double comm_timeout = 300.0;  // seconds a collective may wait for the other ranks
};

// The bucket plan the engine uses (buckets cut at groups when ranks > 1) and this rank's
// optimizer partition under it; the HostOptimizer must be built with the latter.
BucketPlan engine_bucket_plan(const model::ParameterLayout& layout, DType act,
                              const EngineConfig& config);
std::vector<optim::OwnedRange> engine_partition(const model::ParameterLayout& layout, DType act,
                                                const EngineConfig& config);

// Device and host bytes the engine allocates (equal to what it allocates).
struct EngineFootprint {
  std::size_t device_params = 0;  // every parameter, or (stream mode) the window
  std::size_t device_grad_slots = 0, device_stats = 0;  // parameters: n x act dtype
  std::size_t device_comm = 0;   // data parallel: shard slots and the all-gather buffers
  std::size_t device_accum = 0;  // fp32 sum of this rank's shards (accumulating on the device)
  std::size_t host_grads = 0;    // pinned landing buffer(s), act dtype (one bucket per step)
  std::size_t host_ring = 0;     // pinned accumulation ring (accumulating on the host)
  std::size_t host_accum = 0;    // fp32 accumulators (accumulating on the host)
  std::size_t host_upload = 0;   // pinned upload buffer (act dtype other than the master's)
};
EngineFootprint engine_footprint(const model::ParameterLayout& layout, DType act,
                                 const EngineConfig& config);
// grad_accum > 1 with the host summing every micro-batch's buckets (not accumulate_on_device).
inline bool accumulates_on_host(const EngineConfig& c) {
  return c.grad_accum > 1 && !c.accumulate_on_device;
}

// Sizes both the footprint and the engine's parts use, in elements.
std::size_t local_elements(const std::vector<BucketShard>& shards);  // this rank's total
std::size_t max_shard(const std::vector<BucketShard>& shards);       // largest padded shard
std::size_t max_owned(const std::vector<BucketShard>& shards);       // largest owned part
// Largest padded bucket (ranks x shard count) among those cycling through the device ring.
std::size_t max_ring_bucket(const BucketPlan& plan, const std::vector<BucketShard>& shards,
                            int ranks);

}  // namespace zo::offload
