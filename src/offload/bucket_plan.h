// The bucket plan of the offload engine (DESIGN.md §2): contiguous ranges of the flat parameter
// layout, cut at tensor boundaries, each about `target_bytes` of 16-bit gradients, with the
// moment in backward at which each becomes complete.
//
// Backward finishes block L-1 first and the embeddings last (wte also receives the LM-head
// gradient at the very start of backward, so it is complete only after the embedding backward);
// ln_f is complete right after the head. A bucket is ready once every tensor in it is complete,
// so buckets stream to the host in roughly reverse layout order while backward continues.
#pragma once

#include <cstddef>
#include <vector>

#include "model/layout.h"
#include "offload/host_optimizer.h"

namespace zo::offload {

struct Bucket {
  std::size_t index = 0;
  std::size_t begin = 0, end = 0;                // elements of the flat layout
  std::size_t first_tensor = 0, end_tensor = 0;  // [first, end) into layout.tensors()
  // The Gpt::backward hook value after which this bucket is complete: a block index l (the
  // bucket's lowest block), or -1 (it holds wte, wpe: complete after the embedding backward).
  int ready_after = -1;
  std::size_t size() const { return end - begin; }
};

struct BucketPlanOptions {
  std::size_t target_bytes = std::size_t{32} << 20;  // of 16-bit gradients per bucket
  std::size_t grad_elem_bytes = 2;
  // Also cut where the upload groups (embeddings, each block, ln_f) meet, so every bucket lies
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
  // Buckets that become complete at hook value `after` (block index, or -1), highest first.
  const std::vector<std::size_t>& ready_at(int after) const;
  // Bucket holding element `offset` of the layout.
  const Bucket& bucket_of(std::size_t offset) const;
  // Rank `rank` of `ranks`: its shard of every bucket, in bucket order, local offsets ascending.
  std::vector<BucketShard> shards(int rank, int ranks) const;

 private:
  std::vector<Bucket> buckets_;
  std::vector<std::vector<std::size_t>> ready_;  // [after + 1]
  std::size_t max_elements_ = 0;
};

// The optimizer partition of a rank: its non-empty shards as owned ranges, adjacent ones merged
// (a single rank owns one range, the whole layout).
std::vector<OwnedRange> owned_ranges(const std::vector<BucketShard>& shards);

}  // namespace zo::offload
