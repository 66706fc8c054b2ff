#include "offload/engine_config.h"

#include <algorithm>

#include "offload/param_window.h"

namespace zo::offload {

std::size_t local_elements(const std::vector<BucketShard>& shards) {
  return shards.empty() ? 0 : shards.back().local + shards.back().end - shards.back().begin;
}

std::size_t max_shard(const std::vector<BucketShard>& shards) {
  std::size_t m = 0;
  for (const BucketShard& s : shards)
    m = std::max(m, s.count);
  return m;
}

std::size_t max_owned(const std::vector<BucketShard>& shards) {
  std::size_t m = 0;
  for (const BucketShard& s : shards)
    m = std::max(m, s.end - s.begin);
  return m;
}

std::size_t max_ring_bucket(const BucketPlan& plan, const std::vector<BucketShard>& shards,
                            int ranks) {
  std::size_t m = 0;
  for (const Bucket& b : plan.buckets())
    if (!b.own_slot) m = std::max(m, std::size_t(ranks) * shards[b.index].count);
  return m;
}

BucketPlan engine_bucket_plan(const model::ParameterLayout& layout, DType act,
                              const EngineConfig& c) {
  return BucketPlan(layout, {c.bucket_bytes, dtype_size(act), c.ranks > 1});
}

std::vector<optim::OwnedRange> engine_partition(const model::ParameterLayout& layout, DType act,
                                                const EngineConfig& c) {
  return owned_ranges(engine_bucket_plan(layout, act, c).shards(c.rank, c.ranks));
}

EngineFootprint engine_footprint(const model::ParameterLayout& layout, DType act,
                                 const EngineConfig& c) {
  const std::size_t es = dtype_size(act), R = std::size_t(c.ranks);
  const BucketPlan plan = engine_bucket_plan(layout, act, c);
  const std::vector<BucketShard> shards = plan.shards(c.rank, c.ranks);
  const std::size_t n = local_elements(shards);
  EngineFootprint f;
  f.device_params = c.param_window > 0 ? ParamWindow::device_bytes(layout, es, c.param_window)
                                       : layout.size() * es;
  const std::size_t slots = std::size_t(c.device_slots);
  const std::size_t ring = max_ring_bucket(plan, shards, c.ranks);
  for (const Bucket& b : plan.buckets()) {
    if (!b.own_slot) continue;
    f.device_grad_slots += R * shards[b.index].count * es;
    if (R > 1) f.device_comm += shards[b.index].count * es;
  }
  f.device_grad_slots += slots * ring * es;
  // Data parallel: each slot's shard, and the all-gather's input and output.
  if (R > 1) f.device_comm += (slots * (ring / R) + (1 + R) * max_shard(shards)) * es;
  f.device_stats = plan.buckets().size() * 2 * sizeof(float);
  const std::size_t copies = c.dpu ? 2 : 1;
  if (accumulates_on_host(c)) {
    f.host_ring = std::size_t(c.host_slots) * max_owned(shards) * es;
    f.host_accum = copies * n * sizeof(float);
  } else {
    f.host_grads = copies * n * es;
  }
  // One buffer even with DPU: the delayed update reads the landing buffer, not the sum.
  if (c.grad_accum > 1 && c.accumulate_on_device) f.device_accum = n * sizeof(float);
  // Uploads read the master weights themselves when they are in the act dtype and in memory.
  if (act != c.master || c.state_on_drive) f.host_upload = n * es;
  return f;
}

}  // namespace zo::offload
