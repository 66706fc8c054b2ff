#include "offload/bucket_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zo::offload {

BucketPlan::BucketPlan(const model::ParameterLayout& layout, const BucketPlanOptions& options) {
  if (options.target_bytes == 0 || options.grad_elem_bytes == 0) {
    throw std::invalid_argument("--bucket-size must be > 0");
  }
  const std::size_t target =
      std::max<std::size_t>(1, options.target_bytes / options.grad_elem_bytes);
  const auto& tensors = layout.tensors();
  const int L = layout.spec().n_layer;
  // When is a tensor complete? Blocks: their index; ln_f: right after the head, i.e. before
  // block L-1 (hook value L, never called, treated as "at the first hook"); wte/wpe: -1.
  auto complete_after = [&](const model::TensorInfo& t) {
    if (t.layer >= 0) return t.layer;
    return t.kind == model::TensorKind::kEmbedding ? -1 : L - 1;
  };
  auto group = [&](const model::TensorInfo& t) {  // as Gpt::forward's before_read hook
    if (t.layer >= 0) return t.layer;
    return t.kind == model::TensorKind::kEmbedding ? -1 : L;
  };
  std::size_t first = 0;  // first tensor of the bucket being built
  int ready = L;          // min over its tensors of complete_after
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    ready = std::min(ready, complete_after(tensors[i]));
    const std::size_t end = tensors[i].offset + tensors[i].numel;
    const bool last = i + 1 == tensors.size();
    // Never mix the embeddings (complete last) with block tensors (complete earlier): such a
    // bucket would wait for the end of backward.
    const bool boundary =
        !last && ((complete_after(tensors[i]) == -1) != (complete_after(tensors[i + 1]) == -1) ||
                  (options.cut_at_groups && group(tensors[i]) != group(tensors[i + 1])));
    if (last || boundary || end - tensors[first].offset >= target) {
      Bucket bk;
      bk.index = buckets_.size();
      bk.begin = tensors[first].offset;
      bk.end = end;
      bk.first_tensor = first;
      bk.end_tensor = i + 1;
      bk.ready_after = ready;
      max_elements_ = std::max(max_elements_, bk.size());
      buckets_.push_back(bk);
      first = i + 1;
      ready = L;
    }
  }
  ready_.resize(static_cast<std::size_t>(L) + 1);
  for (const Bucket& b : buckets_) {
    const int after = std::min(b.ready_after, L - 1);
    ready_[static_cast<std::size_t>(after + 1)].push_back(b.index);
  }
  for (auto& r : ready_)
    std::sort(r.rbegin(), r.rend());
}

const std::vector<std::size_t>& BucketPlan::ready_at(int after) const {
  if (after < -1 || after + 1 >= static_cast<int>(ready_.size())) {
    throw std::out_of_range("BucketPlan::ready_at: no such backward hook");
  }
  return ready_[static_cast<std::size_t>(after + 1)];
}

const Bucket& BucketPlan::bucket_of(std::size_t offset) const {
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), offset,
                             [](std::size_t o, const Bucket& b) { return o < b.end; });
  if (it == buckets_.end()) throw std::out_of_range("BucketPlan::bucket_of: offset beyond layout");
  return *it;
}

std::vector<BucketShard> BucketPlan::shards(int rank, int ranks) const {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw std::invalid_argument("bucket shards: rank " + std::to_string(rank) + " of " +
                                std::to_string(ranks));
  }
  std::vector<BucketShard> out;
  std::size_t local = 0;
  for (const Bucket& b : buckets_) {
    BucketShard s;
    s.count = (b.size() + std::size_t(ranks) - 1) / std::size_t(ranks);
    s.begin = b.begin + std::min(b.size(), s.count * std::size_t(rank));
    s.end = b.begin + std::min(b.size(), s.count * std::size_t(rank + 1));
    s.local = local;
    local += s.end - s.begin;
    out.push_back(s);
  }
  return out;
}

std::vector<OwnedRange> owned_ranges(const std::vector<BucketShard>& shards) {
  std::vector<OwnedRange> owned;
  for (const BucketShard& s : shards) {
    if (s.end == s.begin) continue;
    if (!owned.empty() && owned.back().end == s.begin) {  // adjacent: one range (one rank: all)
      owned.back().end = s.end;
    } else {
      owned.push_back({s.begin, s.end, s.local});
    }
  }
  return owned;
}

}  // namespace zo::offload
