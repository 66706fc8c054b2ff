// The offload engine's bucket plan: coverage, tensor-aligned cuts, sizes, and readiness order.
#include <gtest/gtest.h>

#include "model/layout.h"
#include "offload/bucket_plan.h"

namespace {

using zo::offload::BucketPlan;

zo::model::ParameterLayout layout_of(int n_layer, int n_embd, int vocab) {
  return zo::model::ParameterLayout(zo::model::model_spec_from_json(
      {{"n_layer", n_layer}, {"n_head", 2}, {"n_embd", n_embd}, {"vocab_size", vocab},
       {"block_size", 32}},
      "plan-test"));
}

void check_plan(const zo::model::ParameterLayout& layout, std::size_t target_bytes) {
  const BucketPlan plan(layout, {target_bytes, 2});
  const auto& b = plan.buckets();
  ASSERT_FALSE(b.empty());
  const auto& tensors = layout.tensors();
  std::size_t expect_begin = 0, expect_tensor = 0;
  for (const auto& x : b) {
    EXPECT_EQ(x.begin, expect_begin);
    EXPECT_EQ(x.first_tensor, expect_tensor);
    EXPECT_EQ(x.begin, tensors[x.first_tensor].offset) << "cut at a tensor boundary";
    EXPECT_LT(x.first_tensor, x.end_tensor);
    // At most one tensor beyond the target: the cut comes right after crossing it.
    const auto& lastt = tensors[x.end_tensor - 1];
    EXPECT_LT(lastt.offset - x.begin, std::max<std::size_t>(1, target_bytes / 2));
    // Readiness: the lowest block of its tensors, or -1 when it holds an embedding, and never a
    // mix of embeddings and block tensors.
    int ready = layout.spec().n_layer - 1;
    bool has_embedding = false, has_block = false;
    for (std::size_t t = x.first_tensor; t < x.end_tensor; ++t) {
      if (tensors[t].kind == zo::model::TensorKind::kEmbedding) has_embedding = true;
      if (tensors[t].layer >= 0) {
        has_block = true;
        ready = std::min(ready, tensors[t].layer);
      }
    }
    EXPECT_FALSE(has_embedding && has_block);
    EXPECT_EQ(x.ready_after, has_embedding ? -1 : ready);
    for (std::size_t off : {x.begin, x.end - 1}) EXPECT_EQ(plan.bucket_of(off).index, x.index);
    expect_begin = x.end;
    expect_tensor = x.end_tensor;
  }
  EXPECT_EQ(expect_begin, layout.size());
  // ready_at partitions the buckets.
  std::vector<int> seen(b.size(), 0);
  for (int after = -1; after < layout.spec().n_layer; ++after) {
    for (std::size_t i : plan.ready_at(after)) {
      ++seen[i];
      EXPECT_EQ(std::min(b[i].ready_after, layout.spec().n_layer - 1), after);
    }
  }
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(BucketPlan, CoversTheLayoutWithTensorAlignedBuckets) {
  const auto layout = layout_of(5, 48, 101);
  // Bucket targets that divide nothing: odd byte counts, smaller than a tensor, about a block,
  // and larger than the model.
  for (std::size_t target : {2u, 1000u, 7777u, 60000u, 1u << 30}) check_plan(layout, target);
}

TEST(BucketPlan, OneBucketPerTensorWhenTheTargetIsTiny) {
  const auto layout = layout_of(3, 16, 37);
  const BucketPlan plan(layout, {2, 2});
  EXPECT_EQ(plan.buckets().size(), layout.tensors().size());
  std::size_t largest = 0;
  for (const auto& t : layout.tensors()) largest = std::max(largest, t.numel);
  EXPECT_EQ(plan.max_bucket_elements(), largest);
  EXPECT_THROW(BucketPlan(layout, {0, 2}), std::invalid_argument);
  EXPECT_THROW(plan.ready_at(3), std::out_of_range);
  EXPECT_THROW(plan.bucket_of(layout.size()), std::out_of_range);
}

TEST(BucketPlan, LastBlocksAreReadyFirst) {
  const auto layout = layout_of(4, 32, 64);
  const BucketPlan plan(layout, {std::size_t(2) * 32 * 32 * 4, 2});  // ~ a third of a block
  // The top hook (block 3) releases the buckets of block 3 and ln_f; -1 releases wte/wpe.
  for (std::size_t i : plan.ready_at(3)) EXPECT_GE(plan.buckets()[i].begin, layout.block_begin(3));
  for (std::size_t i : plan.ready_at(-1)) EXPECT_LT(plan.buckets()[i].begin, layout.block_begin(0));
  EXPECT_FALSE(plan.ready_at(0).empty());
}

}  // namespace
