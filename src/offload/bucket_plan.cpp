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
  auto embedding = [&](std::size_t i) { return tensors[i].kind == model::TensorKind::kEmbedding; };
  auto group = [&](std::size_t i) { return layout.group_of(tensors[i].offset); };
  const bool untied = layout.lm_head() != layout.wte();
  std::size_t first = 0;  // first tensor of the bucket being built
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::size_t end = tensors[i].offset + tensors[i].numel;
    const bool last = i + 1 == tensors.size();
    // Never mix the embeddings (complete last) with block tensors (complete earlier): such a
    // bucket would wait for the end of backward. Never split tensors one GEMM writes together.
    if (!last && tensors[i].joins_next) continue;
    const bool boundary = !last && (embedding(i) != embedding(i + 1) ||
                                    (options.cut_at_groups && group(i) != group(i + 1)));
    if (last || boundary || end - tensors[first].offset >= target) {
      Bucket bk;
      bk.index = buckets_.size();
      bk.begin = tensors[first].offset;
      bk.end = end;
      bk.first_tensor = first;
      bk.end_tensor = i + 1;
      bk.embeddings = embedding(first);
      bk.own_slot =
          bk.embeddings || (untied && bk.begin <= layout.lm_head() && layout.lm_head() < bk.end);
      max_elements_ = std::max(max_elements_, bk.size());
      buckets_.push_back(bk);
      first = i + 1;
    }
  }
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

std::vector<optim::OwnedRange> owned_ranges(const std::vector<BucketShard>& shards) {
  std::vector<optim::OwnedRange> owned;
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
