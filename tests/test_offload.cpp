// The offload engine's bucket plan: coverage, tensor-aligned cuts, sizes, and shards.
#include <gtest/gtest.h>

#include "model/layout.h"
#include "offload/bucket_plan.h"

namespace {

using zo::offload::BucketPlan;

zo::model::ParameterLayout layout_of(int n_layer, int n_embd, int vocab) {
  return zo::model::ParameterLayout(zo::model::model_spec_from_json({{"n_layer", n_layer},
                                                                     {"n_head", 2},
                                                                     {"n_embd", n_embd},
                                                                     {"vocab_size", vocab},
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
    // Embedding buckets (complete only at the end of backward) hold nothing else.
    bool has_embedding = false, has_other = false;
    for (std::size_t t = x.first_tensor; t < x.end_tensor; ++t) {
      (tensors[t].kind == zo::model::TensorKind::kEmbedding ? has_embedding : has_other) = true;
    }
    EXPECT_FALSE(has_embedding && has_other);
    EXPECT_EQ(x.embeddings, has_embedding);
    for (std::size_t off : {x.begin, x.end - 1})
      EXPECT_EQ(plan.bucket_of(off).index, x.index);
    expect_begin = x.end;
    expect_tensor = x.end_tensor;
  }
  EXPECT_EQ(expect_begin, layout.size());
}

TEST(BucketPlan, CoversTheLayoutWithTensorAlignedBuckets) {
  const auto layout = layout_of(5, 48, 101);
  // Bucket targets that divide nothing: odd byte counts, smaller than a tensor, about a block,
  // and larger than the model.
  for (std::size_t target : {2u, 1000u, 7777u, 60000u, 1u << 30})
    check_plan(layout, target);
}

TEST(BucketPlan, OneBucketPerTensorWhenTheTargetIsTiny) {
  const auto layout = layout_of(3, 16, 37);
  const BucketPlan plan(layout, {2, 2});
  EXPECT_EQ(plan.buckets().size(), layout.tensors().size());
  std::size_t largest = 0;
  for (const auto& t : layout.tensors())
    largest = std::max(largest, t.numel);
  EXPECT_EQ(plan.max_bucket_elements(), largest);
  EXPECT_THROW(BucketPlan(layout, {0, 2}), std::invalid_argument);
  EXPECT_THROW(plan.bucket_of(layout.size()), std::out_of_range);
}

// Data parallel: every bucket's shards over the ranks cover it exactly once, in equal padded
// counts, stored back to back per rank; with cut_at_groups no bucket crosses an upload group.
TEST(BucketPlan, ShardsSplitEveryBucketAmongTheRanks) {
  const auto layout = layout_of(3, 48, 101);
  const int L = layout.spec().n_layer;
  for (std::size_t target : {2u, 7777u, 1u << 30}) {
    const BucketPlan plan(layout, {target, 2, true});
    for (const auto& b : plan.buckets()) {  // inside one group: embeddings, a block, or ln_f
      const std::size_t lo = layout.block_begin(0), hi = layout.block_end(L - 1);
      if (b.begin < lo) {
        EXPECT_LE(b.end, lo);
      }
      for (int l = 0; l < L; ++l) {
        if (b.begin >= layout.block_begin(l) && b.begin < layout.block_end(l)) {
          EXPECT_LE(b.end, layout.block_end(l));
        }
      }
      if (b.begin >= hi) {
        EXPECT_LE(b.end, layout.size());
      }
    }
    for (int ranks : {1, 2, 3, 5}) {
      std::vector<int> owner(layout.size(), 0);
      for (int r = 0; r < ranks; ++r) {
        const auto shards = plan.shards(r, ranks);
        ASSERT_EQ(shards.size(), plan.buckets().size());
        std::size_t local = 0;
        for (std::size_t i = 0; i < shards.size(); ++i) {
          const auto& b = plan.buckets()[i];
          const auto& sh = shards[i];
          EXPECT_EQ(sh.count, (b.size() + ranks - 1) / ranks);
          EXPECT_EQ(sh.local, local);
          EXPECT_LE(sh.end - sh.begin, sh.count);
          EXPECT_EQ(sh.begin, std::min(b.end, b.begin + sh.count * r)) << "padded position";
          for (std::size_t e = sh.begin; e < sh.end; ++e)
            ++owner[e];
          local += sh.end - sh.begin;
        }
        const auto owned = zo::offload::owned_ranges(shards);
        if (ranks == 1) {
          ASSERT_EQ(owned.size(), 1u);
          EXPECT_EQ(owned[0].end, layout.size());
        }
      }
      for (int o : owner)
        ASSERT_EQ(o, 1) << ranks << " ranks";
    }
  }
  EXPECT_THROW(BucketPlan(layout, {2, 2}).shards(2, 2), std::invalid_argument);
}

}  // namespace

// ---- the engine on the host backend (streams are threads) -----------------------------------

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "device/device.h"
#include "device/host_stream.h"
#include "engine_rig.h"
#include "model/gpt.h"
#include "offload/engine.h"
#include "optim/host_optimizer.h"
#include "thread_comm.h"

namespace {

using zo::offload::Engine;
using zo::offload::EngineConfig;
using zo::optim::HostOptimizer;

using zo::test::Batches;
using zo::test::download;
using zo::test::engine_step;
using zo::test::odd_spec;

zo::optim::OptimizerConfig opt_config() {
  zo::optim::OptimizerConfig c;
  c.adam.beta1 = 0.9f;
  c.adam.beta2 = 0.95f;
  c.adam.weight_decay = 0.1f;
  c.threads = 2;
  return c;
}

// A host device, its stream, and two optimizers with the same GPT-2 initialisation: `off` feeds
// the engine, `ref` the flat-buffer reference.
struct Rig {
  zo::model::ParameterLayout layout{odd_spec()};
  std::unique_ptr<zo::dev::Device> d = zo::dev::make_host_device({});
  std::unique_ptr<zo::dev::Stream> stream = d->create_stream();
  HostOptimizer ref{layout, opt_config()}, off{layout, opt_config()};
  explicit Rig(std::uint64_t seed) {
    zo::model::init_weights(layout, seed, ref.master().data());
    zo::model::init_weights(layout, seed, off.master().data());
  }
  std::unique_ptr<Engine> engine(const EngineConfig& c) {
    auto e = std::make_unique<Engine>(*d, *stream, layout, off, c);
    e->upload_all();
    return e;
  }
};

// The reference: flat-buffer backward over all micro-batches, then one HostOptimizer step.
struct Reference {
  std::vector<float> grads;
  double sumsq = 0.0;
};
Reference flat_gradients(zo::dev::Device& d, const zo::model::ParameterLayout& layout,
                         const std::vector<float>& params, const Batches& b, int B, int T,
                         float dloss) {
  auto stream = d.create_stream();
  const std::size_t n = layout.size();
  auto p = d.alloc(n * 4, "params"), g = d.alloc(n * 4, "grads");
  d.copy_to_device(p.data(), params.data(), n * 4, *stream);
  d.fill_zero(g.data(), n * 4, *stream);
  zo::model::Gpt gpt(d, layout, {B, T, false});
  for (std::size_t k = 0; k < b.tokens.size(); ++k) {
    gpt.set_batch(b.tokens[k], b.targets[k], *stream);
    gpt.forward(p.data(), T, true, dloss, *stream);
    gpt.backward(p.data(), g.data(), *stream);
  }
  Reference r;
  r.grads.resize(n);
  d.copy_to_host(r.grads.data(), g.data(), n * 4, *stream);
  stream->synchronize();
  for (float x : r.grads)
    r.sumsq += double(x) * x;
  return r;
}

class EngineTest : public ::testing::TestWithParam<std::size_t> {};

// Streaming through bucket slots changes no bit: gradients, the update of master, m and v, and
// the uploaded parameters equal the flat-buffer path, for bucket sizes that do not divide the
// tensors or blocks (and one bucket per tensor, and one for everything).
TEST_P(EngineTest, OneMicroBatchEqualsTheFlatPathBitForBit) {
  Rig rig(7);
  const auto& layout = rig.layout;
  auto& d = rig.d;
  auto& stream = rig.stream;
  HostOptimizer& ref = rig.ref;
  HostOptimizer& off = rig.off;
  const int B = 2, T = 16;
  const std::size_t n = layout.size();
  EngineConfig ec;
  ec.bucket_bytes = GetParam();
  const auto engine = rig.engine(ec);
  Engine& e = *engine;
  zo::model::Gpt gpt(*d, layout, {B, T, false});
  const float dloss = 1.0f / float(B * T), lr = 2e-3f;
  for (int step = 0; step < 3; ++step) {
    const Batches b(1, B * T, 100 + step);
    const std::vector<float> before(ref.master().begin(), ref.master().end());
    const Reference r = flat_gradients(*d, layout, before, b, B, T, dloss);
    const auto st = engine_step(*stream, e, gpt, b, T, dloss, lr);
    EXPECT_FALSE(st.nonfinite);
    EXPECT_NEAR(st.sumsq, r.sumsq, 1e-5 * r.sumsq) << "step " << step;
    ref.step({r.grads.data(), n, zo::DType::kF32}, lr, 1.0f);
    e.drain();
    ASSERT_EQ(off.state().step, ref.state().step);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(off.master()[i], ref.master()[i]) << "step " << step << " element " << i;
    }
    const auto m1 = static_cast<const float*>(off.exp_avg().data);
    const auto m2 = static_cast<const float*>(ref.exp_avg().data);
    const auto v1 = static_cast<const float*>(off.exp_avg_sq().data);
    const auto v2 = static_cast<const float*>(ref.exp_avg_sq().data);
    ASSERT_TRUE(std::equal(m1, m1 + n, m2));
    ASSERT_TRUE(std::equal(v1, v1 + n, v2));
    // The device parameters the next forward reads are the new master weights.
    EXPECT_EQ(download(*d, e.params(), n),
              std::vector<float>(off.master().begin(), off.master().end()));
  }
}

INSTANTIATE_TEST_SUITE_P(BucketSizes, EngineTest,
                         ::testing::Values(std::size_t{1}, std::size_t{4096} + 12,
                                           std::size_t{30011}, std::size_t{1} << 30));

// A rank's optimizer over its partition updates exactly what the whole optimizer updates there,
// bit for bit (fp32 and bf16 state; fp32 and bf16 master, whose random rounding bits follow the
// layout index), group range by group range as the engine calls it.
TEST(HostOptimizer, PartitionsUpdateLikeTheWhole) {
  const zo::model::ParameterLayout layout(odd_spec());
  const std::size_t n = layout.size();
  const zo::offload::BucketPlan plan(layout, {4108, 4, true});
  std::vector<float> init(n);
  zo::model::init_weights(layout, 7, init.data());
  for (const zo::DType master : {zo::DType::kF32, zo::DType::kBF16})
    for (const zo::DType sd : {zo::DType::kF32, zo::DType::kBF16}) {
      SCOPED_TRACE(std::string(zo::dtype_name(master)) + " master");
      auto c = opt_config();
      c.state_format = sd == zo::DType::kF32 ? zo::StateFormat::kF32 : zo::StateFormat::kBF16;
      c.master_dtype = master;
      c.seed = 5;
      HostOptimizer whole(layout, c);
      whole.put_master(0, init);
      std::vector<std::unique_ptr<HostOptimizer>> parts;
      for (int r = 0; r < 3; ++r) {
        parts.push_back(std::make_unique<HostOptimizer>(
            layout, c, zo::offload::owned_ranges(plan.shards(r, 3))));
        parts.back()->put_master(0, init);
      }
      std::mt19937 rng(11);
      std::normal_distribution<float> g(0.0f, 1e-2f);
      std::vector<float> grads(n), local;
      for (std::int64_t t = 1; t <= 3; ++t) {
        for (auto& x : grads)
          x = g(rng);
        whole.step({grads.data(), n, zo::DType::kF32}, 1e-3f, 0.5f);
        for (auto& p : parts) {
          local.resize(p->size());
          p->take_owned(grads.data(), local.data());
          for (const zo::model::Range& r : layout.groups()) {  // embeddings, blocks, ln_f
            p->update_range(r.begin, r.end, {local.data(), local.size(), zo::DType::kF32}, t, 1e-3f,
                            0.5f);
          }
        }
      }
      std::vector<float> all(n);
      whole.read_master(0, all);
      EXPECT_NE(all, init);
      std::size_t total = 0;
      for (auto& p : parts) {
        std::vector<float> expect(p->size()), got(p->size());
        p->take_owned(all.data(), expect.data());
        p->read_master(0, got);
        ASSERT_EQ(got, expect);
        const std::size_t es = zo::dtype_size(sd);
        std::vector<char> m(p->size() * es);
        for (const auto& o : p->owned())
          std::memcpy(m.data() + o.local * es,
                      static_cast<const char*>(whole.exp_avg().data) + o.begin * es,
                      (o.end - o.begin) * es);
        EXPECT_EQ(std::memcmp(m.data(), p->exp_avg().data, m.size()), 0);
        total += p->size();
      }
      EXPECT_EQ(total, n);
    }
  EXPECT_THROW(HostOptimizer(layout, opt_config(), {{5, 3, 0}}), std::invalid_argument);
  EXPECT_THROW(HostOptimizer(layout, opt_config(), {{0, 4, 0}, {2, 8, 4}}), std::invalid_argument);
  EXPECT_THROW(HostOptimizer(layout, opt_config(), {{0, 4, 1}}), std::invalid_argument);
}

// q8 moments set from fp32 values: each block's absmax is its largest magnitude, every value
// reads back within half a step of the map at that magnitude (the map's steps are at most 0.9/64
// of a decade's top), a value read back and written again keeps its codes, and a block whose
// largest value is below FLT_MIN is flushed to zero as the kernels do (its reciprocal would
// overflow).
TEST(HostOptimizer, Q8MomentsWrittenFromFloatsReadBackWithinAStep) {
  const zo::model::ParameterLayout layout(odd_spec());
  auto c = opt_config();
  c.state_format = zo::StateFormat::kQ8;
  HostOptimizer opt(layout, c);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  for (const auto& seg : opt.segments()) {
    std::vector<float> v(seg.end - seg.begin), back(v.size());
    for (auto& x : v)
      x = g(rng);
    if (v.size() > 2048)
      for (std::size_t i = 0; i < 2048; ++i)
        v[i] = 1e-39f * float(i % 7);  // subnormal: the first block flushes
    opt.write_moment(0, seg.begin, v);
    opt.read_moment(0, seg.begin, back);
    for (std::size_t b = 0; b < v.size(); b += 2048) {
      const std::size_t e = std::min(v.size(), b + 2048);
      float absmax = 0.0f;
      for (std::size_t i = b; i < e; ++i)
        absmax = std::max(absmax, std::fabs(v[i]));
      for (std::size_t i = b; i < e; ++i) {
        if (absmax < std::numeric_limits<float>::min()) {
          ASSERT_EQ(back[i], 0.0f) << i;
          continue;
        }
        // The decade of |v| below the top: its step is 10^-E * 0.9 / 2^(6-E) of absmax.
        const double r = std::fabs(double(v[i])) / double(absmax);
        int E = 0;
        while (E < 6 && r < std::pow(10.0, -E - 1))
          ++E;
        const double step = std::pow(10.0, -E) * 0.9 / std::pow(2.0, 6 - E) * absmax;
        ASSERT_NEAR(back[i], v[i], 0.5 * step + 1e-7 * absmax) << i;
      }
    }
    std::vector<float> again(v.size());
    opt.write_moment(0, seg.begin, back);
    opt.read_moment(0, seg.begin, again);
    ASSERT_EQ(again, back);
  }
}

// Data parallel through the engine (reduce-scatter on the gradient stream, partitioned CPU
// Adam, all-gather on the upload stream, all-reduced norm), ranks as threads. With both ranks on
// the same batch and half the loss gradient each, the reduce-scatter's a/2 + a/2 is exactly a,
// so two ranks must reproduce one engine bit for bit: master, m, v and the device parameters,
// with accumulation (on the host and on the device, where each rank sums its reduced shards) and
// DPU too.
struct DpCase {
  int accum;
  bool dpu;
  bool on_device = false;
};
class EngineDataParallel : public ::testing::TestWithParam<DpCase> {};

TEST_P(EngineDataParallel, TwoRanksOnOneBatchEqualOneEngineBitForBit) {
  const DpCase pc = GetParam();
  const zo::model::ParameterLayout layout(odd_spec());
  const std::size_t n = layout.size();
  const int B = 2, T = 16, steps = 4;
  const float dloss = 1.0f / float(B * T * pc.accum), lr = 2e-3f;
  std::vector<Batches> batches;
  for (int s = 0; s < steps; ++s)
    batches.emplace_back(pc.accum, B * T, 300 + s);
  EngineConfig ec;
  ec.bucket_bytes = 4108;  // odd: shards of unequal length, padding
  ec.grad_accum = pc.accum;
  ec.dpu = pc.dpu;
  ec.accumulate_on_device = pc.on_device;

  // One engine.
  auto d = zo::dev::make_host_device({});
  auto stream = d->create_stream();
  HostOptimizer one(layout, opt_config());
  zo::model::init_weights(layout, 9, one.master().data());
  std::vector<double> sumsq_one;
  std::vector<float> params_one;
  {
    Engine e(*d, *stream, layout, one, ec);
    e.upload_all();
    zo::model::Gpt gpt(*d, layout, {B, T, false});
    for (int s = 0; s < steps; ++s)
      sumsq_one.push_back(engine_step(*stream, e, gpt, batches[s], T, dloss, lr, pc.dpu).sumsq);
    e.drain();
    params_one = download(*d, e.params(), n);
  }

  // Two ranks: threads with their own device, optimizer partition and engine.
  constexpr int R = 2;
  auto hub = std::make_shared<zo::test::ThreadCommHub>(R);
  std::vector<float> master(n, NAN), m(n, NAN), v(n, NAN);
  std::vector<std::vector<float>> params(R);
  std::vector<std::vector<double>> sumsq(R);
  std::vector<std::string> errors(R);
  std::vector<std::thread> ranks;
  for (int r = 0; r < R; ++r) {
    ranks.emplace_back([&, r] {
      try {
        zo::test::ThreadComm comm(hub, r);
        EngineConfig c = ec;
        c.ranks = R;
        c.rank = r;
        auto dr = zo::dev::make_host_device({});
        auto sr = dr->create_stream();
        HostOptimizer opt(layout, opt_config(),
                          zo::offload::engine_partition(layout, zo::DType::kF32, c));
        std::vector<float> whole(n);
        zo::model::init_weights(layout, 9, whole.data());
        opt.take_owned(whole.data(), opt.master().data());
        {
          Engine e(*dr, *sr, layout, opt, c, nullptr, &comm);
          e.upload_all();
          zo::model::Gpt gpt(*dr, layout, {B, T, false});
          for (int s = 0; s < steps; ++s) {
            sumsq[r].push_back(
                engine_step(*sr, e, gpt, batches[s], T, dloss / R, lr, pc.dpu).sumsq);
          }
          e.drain();
          params[r] = download(*dr, e.params(), n);
        }
        // Ranks own disjoint ranges: writing them into the shared arrays does not race.
        for (const auto& o : opt.owned()) {
          for (std::size_t i = o.begin; i < o.end; ++i) {
            master[i] = opt.master()[o.local + (i - o.begin)];
            m[i] = static_cast<const float*>(opt.exp_avg().data)[o.local + (i - o.begin)];
            v[i] = static_cast<const float*>(opt.exp_avg_sq().data)[o.local + (i - o.begin)];
          }
        }
      } catch (const std::exception& ex) {
        errors[r] = ex.what();
      }
    });
  }
  for (auto& t : ranks)
    t.join();
  for (int r = 0; r < R; ++r)
    ASSERT_EQ(errors[r], "") << "rank " << r;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(master[i], one.master()[i]) << "element " << i;
    ASSERT_EQ(m[i], static_cast<const float*>(one.exp_avg().data)[i]) << "m " << i;
    ASSERT_EQ(v[i], static_cast<const float*>(one.exp_avg_sq().data)[i]) << "v " << i;
  }
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(params[r], params_one) << "rank " << r << " device parameters";
    ASSERT_EQ(sumsq[r].size(), sumsq_one.size());
    for (int s = 0; s < steps; ++s)  // per-shard sums in another order; both ranks agree
      EXPECT_NEAR(sumsq[r][s], sumsq_one[s], 1e-5 * sumsq_one[s]);
    EXPECT_EQ(sumsq[r], sumsq[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, EngineDataParallel,
                         ::testing::Values(DpCase{1, false}, DpCase{2, false}, DpCase{1, true},
                                           DpCase{3, false, true}, DpCase{2, true, true}));

// Accumulating three micro-batches on the host in fp32 matches accumulating them on the device
// (only the summation order differs), and the norm is that of the accumulated gradient.
TEST(Engine, AccumulationMatchesTheFlatPath) {
  Rig rig(11);
  const auto& layout = rig.layout;
  auto& d = rig.d;
  auto& stream = rig.stream;
  HostOptimizer& ref = rig.ref;
  HostOptimizer& off = rig.off;
  const int B = 1, T = 16, A = 3;
  const std::size_t n = layout.size();
  EngineConfig ec;
  ec.bucket_bytes = 20000;
  ec.grad_accum = A;
  ec.host_slots = 2;  // fewer slots than buckets: the producer must wait for the accumulator
  const auto engine = rig.engine(ec);
  Engine& e = *engine;
  zo::model::Gpt gpt(*d, layout, {B, T, false});
  const float dloss = 1.0f / float(B * T * A), lr = 3e-3f;
  for (int step = 0; step < 2; ++step) {
    // Each step starts the reference from the engine's state, so differences do not compound.
    std::copy(off.master().begin(), off.master().end(), ref.master().begin());
    for (auto [from, to] :
         {std::pair{off.exp_avg(), ref.exp_avg()}, std::pair{off.exp_avg_sq(), ref.exp_avg_sq()}}) {
      std::memcpy(to.data, from.data, n * 4);
    }
    ref.state().step = off.state().step;
    const Batches b(A, B * T, 200 + step);
    const std::vector<float> before(ref.master().begin(), ref.master().end());
    const Reference r = flat_gradients(*d, layout, before, b, B, T, dloss);
    const auto st = engine_step(*stream, e, gpt, b, T, dloss, lr);
    EXPECT_NEAR(st.sumsq, r.sumsq, 1e-5 * r.sumsq);
    ref.step({r.grads.data(), n, zo::DType::kF32}, lr, 1.0f);
    e.drain();
    double max_rel = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double delta = std::abs(double(off.master()[i]) - ref.master()[i]);
      max_rel = std::max(max_rel, delta / (std::abs(double(ref.master()[i])) + 1e-3));
    }
    EXPECT_LT(max_rel, 1e-4) << "step " << step;
  }
}

// Summing the micro-batches on the device instead of the host changes no bit in fp32 (the sum is
// the same additions in the same order, and rounding it to fp32 is exact): the gradients CPU Adam
// reads, and so master, m, v and the parameters, over steps with and without DPU (each step's
// sum starts afresh). Only the norm is summed differently (per bucket in fp32 on the device, per
// chunk on the host): 1e-5 relative.
TEST(Engine, DeviceAccumulationEqualsHostAccumulationInFp32) {
  Rig rig(13);
  const auto& layout = rig.layout;
  const std::size_t n = layout.size();
  const int B = 1, T = 16, A = 3;
  EngineConfig ec;
  ec.bucket_bytes = 4108;  // cuts tensors and blocks anywhere
  ec.grad_accum = A;
  ec.dpu = true;
  ec.host_slots = 2;
  const auto host_engine = rig.engine(ec);
  ec.accumulate_on_device = true;
  auto device_engine = std::make_unique<Engine>(*rig.d, *rig.stream, layout, rig.ref, ec);
  device_engine->upload_all();
  zo::model::Gpt gpt(*rig.d, layout, {B, T, false});
  const float dloss = 1.0f / float(B * T * A), lr = 3e-3f;
  for (int step = 0; step < 4; ++step) {
    const bool dpu = step >= 2;
    const Batches b(A, B * T, 400 + step);
    const auto on_host =
        zo::test::engine_gradients(*rig.stream, *host_engine, gpt, b, T, dloss, dpu);
    const auto on_device =
        zo::test::engine_gradients(*rig.stream, *device_engine, gpt, b, T, dloss, dpu);
    EXPECT_FALSE(on_device.nonfinite);
    EXPECT_NEAR(on_device.sumsq, on_host.sumsq, 1e-5 * on_host.sumsq) << "step " << step;
    const auto gh = host_engine->host_grads(), gd = device_engine->host_grads();
    ASSERT_EQ(gh.dtype, zo::DType::kF32);
    ASSERT_EQ(gd.dtype, zo::DType::kF32);
    ASSERT_EQ(gd.size, n);
    ASSERT_EQ(std::memcmp(gd.data, gh.data, n * 4), 0) << "step " << step;
    host_engine->start_update(lr, 1.0f);
    device_engine->start_update(lr, 1.0f);
  }
  host_engine->drain();
  device_engine->drain();
  ASSERT_TRUE(
      std::equal(rig.ref.master().begin(), rig.ref.master().end(), rig.off.master().begin()));
  for (auto [a, b] : {std::pair{rig.off.exp_avg(), rig.ref.exp_avg()},
                      std::pair{rig.off.exp_avg_sq(), rig.ref.exp_avg_sq()}}) {
    EXPECT_EQ(std::memcmp(a.data, b.data, n * 4), 0);
  }
  EXPECT_EQ(download(*rig.d, device_engine->params(), n),
            download(*rig.d, host_engine->params(), n));
}

// A NaN anywhere in one micro-batch's gradients is reported; nothing has been updated yet.
TEST(Engine, NonFiniteGradientsAreReportedBeforeAnyUpdate) {
  Rig rig(5);
  const auto& layout = rig.layout;
  auto& stream = rig.stream;
  HostOptimizer& off = rig.off;
  off.master()[layout.block(1).fc_w + 17] = NAN;  // poisons the gradients of everything below
  for (int accum : {1, 2}) {
    EngineConfig ec;
    ec.bucket_bytes = 8192;
    ec.grad_accum = accum;
    const auto engine = rig.engine(ec);
    Engine& e = *engine;
    zo::model::Gpt gpt(*rig.d, layout, {1, 16, false});
    const Batches b(accum, 16, 9);
    e.begin_step(false);
    for (int k = 0; k < accum; ++k) {
      gpt.set_batch(b.tokens[std::size_t(k)], b.targets[std::size_t(k)], *stream);
      gpt.forward(e, 16, true, 1.0f, *stream);
      e.begin_micro_batch(k);
      gpt.backward(e, *stream);
    }
    EXPECT_TRUE(e.finish_gradients().nonfinite) << "grad_accum " << accum;
    EXPECT_EQ(off.state().step, 0);
  }
}

// An engine destroyed mid-step (an error unwinding before finish_gradients) first waits for the
// compute stream, which still reads its parameters and writes its gradient slots: a stream held
// up by a slow task keeps the step queued while the engine goes. Under AddressSanitizer
// (tests/run_asan.sh) a free before that wait is a heap-use-after-free in the stream's worker.
TEST(Engine, DestroyedMidStepWaitsForTheComputeStream) {
  for (const bool dpu : {false, true}) {
    Rig rig(5);
    EngineConfig ec;
    ec.bucket_bytes = 8192;
    ec.dpu = dpu;
    auto engine = rig.engine(ec);
    zo::model::Gpt gpt(*rig.d, rig.layout, {4, 16, false});
    const Batches b(1, 64, 9);
    auto& host_stream = dynamic_cast<zo::dev::HostStream&>(*rig.stream);
    host_stream.enqueue([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
    engine->begin_step(dpu);
    gpt.set_batch(b.tokens[0], b.targets[0], *rig.stream);
    gpt.forward(*engine, 16, true, 1.0f, *rig.stream);
    engine->begin_micro_batch(0);
    gpt.backward(*engine, *rig.stream);
    engine.reset();
    rig.stream->synchronize();  // nothing is left to run: the engine waited
  }
}

// An Inf in one element of one micro-batch (of three) is an overflow of the step, wherever the
// micro-batches are summed; the same run without it is clean.
TEST(Engine, InfInOneMicroBatchIsReported) {
  Rig rig(5);
  const auto& layout = rig.layout;
  const std::size_t at = layout.block(1).fc_w + 17;
  for (const bool on_device : {false, true}) {
    for (const int micro : {0, 1, 2, 3}) {  // 3: none of the three
      EngineConfig ec;
      ec.bucket_bytes = 8192;
      ec.grad_accum = 3;
      ec.accumulate_on_device = on_device;
      const auto engine = rig.engine(ec);
      zo::model::Gpt gpt(*rig.d, layout, {1, 16, false});
      zo::test::CorruptOneGradient store(*engine, *rig.d, *rig.stream, at,
                                         zo::test::element_bytes(INFINITY, zo::DType::kF32), micro);
      const auto st = zo::test::engine_gradients(*rig.stream, *engine, gpt, Batches(3, 16, 9), 16,
                                                 1.0f / 48, false, &store);
      EXPECT_EQ(st.nonfinite, micro < 3) << "on device " << on_device << ", micro-batch " << micro;
      EXPECT_EQ(rig.off.state().step, 0);
    }
  }
}

// DPU: the forward of step t+1 reads the parameters of update t-1 (one step stale), and the
// update itself is the same computation as without DPU, given the gradients it received.
TEST(Engine, DelayedUpdateReadsParametersOneStepStale) {
  Rig rig(3);
  const auto& layout = rig.layout;
  const std::size_t n = layout.size();
  auto& d = rig.d;
  auto& stream = rig.stream;
  HostOptimizer& off = rig.off;
  EngineConfig ec;
  ec.bucket_bytes = 10000;
  ec.dpu = true;
  const auto engine = rig.engine(ec);
  Engine& e = *engine;
  zo::model::Gpt gpt(*d, layout, {1, 16, false});
  const std::vector<float> initial(off.master().begin(), off.master().end());
  std::vector<std::vector<float>> seen, after_update;
  for (int step = 0; step < 4; ++step) {
    const Batches b(1, 16, 50 + step);
    e.begin_step(true);
    gpt.set_batch(b.tokens[0], b.targets[0], *stream);
    gpt.forward(e, 16, true, 1.0f / 16, *stream);
    stream->synchronize();
    seen.push_back(download(*d, e.params(), n));  // what this step's forward read
    e.begin_micro_batch(0);
    gpt.backward(e, *stream);
    e.finish_gradients();  // with DPU: waits for update step-1 and uploads it
    if (step > 0) after_update.emplace_back(off.master().begin(), off.master().end());
    e.start_update(1e-2f, 1.0f);
  }
  e.drain();
  EXPECT_EQ(seen[0], initial);
  EXPECT_EQ(seen[1], initial) << "step 1 runs while update 0 is still delayed";
  EXPECT_NE(after_update[0], initial);
  EXPECT_EQ(seen[2], after_update[0]);
  EXPECT_EQ(seen[3], after_update[1]);
  EXPECT_EQ(download(*d, e.params(), n),
            std::vector<float>(off.master().begin(), off.master().end()))
      << "drain uploads the last update";
  EXPECT_EQ(off.state().step, 4);
}

}  // namespace
