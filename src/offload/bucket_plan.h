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

 private:
  std::vector<Bucket> buckets_;
  std::vector<std::vector<std::size_t>> ready_;  // [after + 1]
  std::size_t max_elements_ = 0;
};

}  // namespace zo::offload
