// The bucket plan of the offload engine (docs/offload.md): contiguous ranges of the flat
// parameter layout, cut at tensor boundaries, each about `target_bytes` of 16-bit gradients.
//
// Backward finishes ln_f and block L-1 first and the embeddings last (wte also receives the
// LM-head gradient at the very start of backward, so it is complete only after the embedding
// backward). A bucket is complete once every tensor in it is, so buckets stream to the host in
// descending layout order while backward continues; the embedding buckets come last.
#pragma once

#include <cstddef>
#include <vector>

#include "model/layout.h"
#include "optim/host_optimizer.h"

namespace zo::offload {

struct Bucket {
  std::size_t index = 0;
  std::size_t begin = 0, end = 0;                // elements of the flat layout
  std::size_t first_tensor = 0, end_tensor = 0;  // [first, end) into layout.tensors()
  // Holds wte / wpe: complete only at the end of backward. Never mixed with other tensors.
  bool embeddings = false;
  // Has a device slot of its own instead of one of the ring's: the embeddings (written first and
  // last), and an untied LM head (V x C, many times a block's buckets: ring slots sized by it
  // would all be that large).
  bool own_slot = false;
  std::size_t size() const { return end - begin; }
};

struct BucketPlanOptions {
  std::size_t target_bytes = std::size_t{32} << 20;  // of 16-bit gradients per bucket
  std::size_t grad_elem_bytes = 2;
  // Also cut where the parameter groups (ParameterLayout::groups()) meet, so every bucket lies
  // in one group: data parallelism all-gathers a group's parameters bucket by bucket.
  bool cut_at_groups = false;
};

// Data parallel: bucket b splits into `ranks` shards of ceil(size / ranks) elements (the last
// ones padded with zeros for the collectives); rank r owns layout elements [begin, end) of it.
struct BucketShard {
  std::size_t count = 0;           // padded shard length: reduce-scatter / all-gather count
  std::size_t begin = 0, end = 0;  // owned layout elements (end - begin <= count; may be empty)
  std::size_t local = 0;           // where they sit in the rank's local arrays
};

class BucketPlan {
 public:
  BucketPlan(const model::ParameterLayout& layout, const BucketPlanOptions& options);

  const std::vector<Bucket>& buckets() const { return buckets_; }  // layout order
  std::size_t max_bucket_elements() const { return max_elements_; }
  // Bucket holding element `offset` of the layout.
  const Bucket& bucket_of(std::size_t offset) const;
  // Rank `rank` of `ranks`: its shard of every bucket, in bucket order, local offsets ascending.
  std::vector<BucketShard> shards(int rank, int ranks) const;

 private:
  std::vector<Bucket> buckets_;
  std::size_t max_elements_ = 0;
};

// The optimizer partition of a rank: its non-empty shards as owned ranges, adjacent ones merged
// (a single rank owns one range, the whole layout).
std::vector<optim::OwnedRange> owned_ranges(const std::vector<BucketShard>& shards);

}  // namespace zo::offload
