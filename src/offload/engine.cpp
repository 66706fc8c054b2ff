#include "offload/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

#include "device/make_device.h"
#include "offload/host_accumulate.h"

namespace zo::offload {
namespace {

using Clock = std::chrono::steady_clock;

bool is_embedding(const Bucket& b) {
  return b.ready_after == -1;
}

// Largest padded bucket (ranks x shard count) among those cycling through the device ring.
std::size_t max_ring_bucket(const BucketPlan& plan, const std::vector<BucketShard>& shards,
                            int ranks) {
  std::size_t m = 0;
  for (const Bucket& b : plan.buckets())
    if (!is_embedding(b)) m = std::max(m, std::size_t(ranks) * shards[b.index].count);
  return m;
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
std::size_t local_size(const std::vector<BucketShard>& shards) {
  return shards.empty() ? 0 : shards.back().local + shards.back().end - shards.back().begin;
}

std::vector<std::unique_ptr<dev::Event>> make_events(dev::Device& d, std::size_t n) {
  std::vector<std::unique_ptr<dev::Event>> v;
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(d.create_event());
  return v;
}

}  // namespace

BucketPlan engine_bucket_plan(const model::ParameterLayout& layout, DType act,
                              const EngineConfig& c) {
  return BucketPlan(layout, {c.bucket_bytes, dtype_size(act), c.ranks > 1});
}

std::vector<OwnedRange> engine_partition(const model::ParameterLayout& layout, DType act,
                                         const EngineConfig& c) {
  return owned_ranges(engine_bucket_plan(layout, act, c).shards(c.rank, c.ranks));
}

EngineFootprint engine_footprint(const model::ParameterLayout& layout, DType act,
                                 const EngineConfig& c) {
  const std::size_t es = dtype_size(act), R = std::size_t(c.ranks);
  const BucketPlan plan = engine_bucket_plan(layout, act, c);
  const std::vector<BucketShard> shards = plan.shards(c.rank, c.ranks);
  const std::size_t n = local_size(shards);
  EngineFootprint f;
  const std::size_t slots = std::size_t(c.device_slots);
  const std::size_t ring = max_ring_bucket(plan, shards, c.ranks);
  for (const Bucket& b : plan.buckets()) {
    if (!is_embedding(b)) continue;
    f.device_grad_slots += R * shards[b.index].count * es;
    if (R > 1) f.device_comm += shards[b.index].count * es;
  }
  f.device_grad_slots += slots * ring * es;
  // Data parallel: each slot's shard, and the all-gather's input and output.
  if (R > 1) f.device_comm += (slots * (ring / R) + (1 + R) * max_shard(shards)) * es;
  f.device_stats = plan.buckets().size() * 2 * sizeof(float);
  const std::size_t copies = c.dpu ? 2 : 1;
  if (c.grad_accum > 1) {
    f.host_ring = std::size_t(c.host_slots) * max_owned(shards) * es;
    f.host_accum = copies * n * sizeof(float);
  } else {
    f.host_grads = copies * n * es;
  }
  if (act != DType::kF32) f.host_upload = n * es;
  return f;
}

Engine::Engine(dev::Device& device, dev::Stream& compute, const model::ParameterLayout& layout,
               HostOptimizer& optimizer, const EngineConfig& config, report::Trace* trace,
               comm::Communicator* comm)
    : dev_(device),
      compute_(compute),
      layout_(layout),
      opt_(optimizer),
      cfg_(config),
      trace_(trace),
      plan_(engine_bucket_plan(layout, device.act_dtype(), config)),
      act_(device.act_dtype()),
      esize_(dtype_size(act_)),
      shards_(plan_.shards(config.rank, config.ranks)),
      comm_(comm) {
  if (cfg_.grad_accum < 1) throw std::invalid_argument("offload engine: grad_accum must be >= 1");
  if (cfg_.device_slots < 2 || cfg_.host_slots < 1) {
    throw std::invalid_argument("offload engine: need >= 2 device slots and >= 1 host slot");
  }
  if (parallel() &&
      (comm_ == nullptr || comm_->size() != cfg_.ranks || comm_->rank() != cfg_.rank)) {
    throw std::invalid_argument("offload engine: config.ranks > 1 needs the job's communicator");
  }
  if (opt_.owned() != owned_ranges(shards_)) {
    throw std::invalid_argument(
        "offload engine: the optimizer does not hold this rank's partition (engine_partition)");
  }
  const std::size_t n = layout.size(), nl = opt_.size(), nb = plan_.buckets().size();
  const std::size_t R = std::size_t(cfg_.ranks);
  const int L = layout.spec().n_layer;
  groups_.push_back({0, layout.block_begin(0)});
  for (int l = 0; l < L; ++l)
    groups_.push_back({layout.block_begin(l), layout.block_end(l)});
  groups_.push_back({layout.block_end(L - 1), n});

  d2h_ = dev_.create_stream();
  h2d_ = dev_.create_stream();
  params_ = dev_.alloc(n * esize_, "parameters");
  stats_ = dev_.alloc(nb * 2 * sizeof(float), "bucket norms and overflow flags");
  for (const Bucket& b : plan_.buckets()) {
    if (!is_embedding(b)) continue;
    embed_slots_.push_back(make_slot(R * shards_[b.index].count, "embedding gradient bucket"));
  }
  for (int k = 0; k < cfg_.device_slots; ++k)
    slots_.push_back(
        make_slot(max_ring_bucket(plan_, shards_, cfg_.ranks), "gradient bucket slot"));
  bucket_slot_.assign(nb, nullptr);
  if (parallel()) {
    // Gradients and parameters flow on different streams: one communicator each.
    grad_comm_ = comm::make_stream_comm(dev_, *comm_, cfg_.comm_timeout);
    param_comm_ = comm::make_stream_comm(dev_, *comm_, cfg_.comm_timeout);
    gather_in_ = dev_.alloc(max_shard(shards_) * esize_, "parameter shard for the all-gather");
    gather_out_ = dev_.alloc(R * max_shard(shards_) * esize_, "all-gathered parameters");
    dev_.fill_zero(gather_in_.data(), gather_in_.bytes(), *h2d_);  // the padding is never garbage
  }

  const pinned::PinOptions pin = dev::staging_pin_options(dev_, cfg_.pin);
  const int copies = cfg_.dpu ? 2 : 1;
  if (cfg_.grad_accum > 1) {
    ring_ = std::make_unique<pinned::BucketRing>(std::size_t(cfg_.host_slots),
                                                 max_owned(shards_) * esize_, pin);
    ring_events_ = make_events(dev_, std::size_t(cfg_.host_slots));
    for (int k = 0; k < copies; ++k)
      accum_[k] = pinned::HostBuffer::allocate_array<float>(nl, {}, cpu_adam::kChunkElements);
  } else {
    for (int k = 0; k < copies; ++k)
      host_grads_[k] = pinned::PinnedBuffer(nl * esize_, pin);
  }
  if (act_ != DType::kF32) upload_ = pinned::PinnedBuffer(nl * esize_, pin);
  stats_host_ = pinned::PinnedBuffer(nb * 2 * sizeof(float), pin);

  const std::size_t copies_per_step = std::size_t(cfg_.grad_accum) * nb;
  copy_begin_ = make_events(dev_, copies_per_step);
  copy_end_ = make_events(dev_, copies_per_step);
  up_begin_ = make_events(dev_, groups_.size());
  up_end_ = make_events(dev_, groups_.size());
  stall_begin_ = make_events(dev_, groups_.size());
  stall_end_ = make_events(dev_, groups_.size());
  bucket_ready_ = dev_.create_event();
  bwd_done_ = dev_.create_event();
  stats_ready_ = dev_.create_event();
  synced_ = dev_.create_event();
  adam_done_.assign(groups_.size(), 0);
  uploaded_.assign(groups_.size(), 1);
  up_recorded_.assign(groups_.size(), 0);
  waited_.assign(groups_.size(), 1);

  clock_ = dev::EventClock(dev_, compute_, trace_ ? trace_->now_us() : 0.0);

  accumulator_ = std::make_unique<SerialQueue>("offload accumulate thread");
  adam_ = std::make_unique<SerialQueue>("offload Adam thread");
}

Engine::~Engine() {
  // Data parallel: a collective that never completes would block everything below; the streams
  // get the communication timeout, then the collectives are aborted.
  if (parallel()) {
    for (dev::Stream* s : {d2h_.get(), h2d_.get()}) {
      try {
        if (s) sync_bounded(*s, "shutting down");
      } catch (const std::exception&) {
      }
    }
  }
  // Nothing may still read or write the buffers below once they are freed.
  for (SerialQueue* w : {adam_.get(), accumulator_.get()}) {
    try {
      if (w) w->wait_idle();
    } catch (const std::exception&) {
      // Reported by whoever waited on the step; nothing to add while tearing down.
    }
  }
  for (dev::Stream* s : {d2h_.get(), h2d_.get(), &compute_}) {
    try {
      if (s) s->synchronize();
    } catch (const std::exception&) {
    }
  }
}

Engine::Slot Engine::make_slot(std::size_t elements, const char* what) {
  Slot s;
  s.buf = dev_.alloc(elements * esize_, what);
  if (parallel()) s.shard = dev_.alloc(elements / std::size_t(cfg_.ranks) * esize_, what);
  s.free = dev_.create_event();
  return s;
}

void Engine::upload_all() {
  drain();
  if (act_ != DType::kF32)
    convert_from_float(opt_.master().data(), upload_.data(), act_, opt_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g)
    enqueue_upload(g);
  sync_bounded(*h2d_, "the parameter all-gather");
}

void Engine::sync_bounded(dev::Stream& s, const char* what) {
  if (parallel()) {
    dev_.record(*synced_, s);
    const auto deadline = Clock::now() + std::chrono::duration<double>(cfg_.comm_timeout);
    for (int spins = 0; !synced_->query(); ++spins) {
      if (Clock::now() > deadline) {
        grad_comm_->abort();
        param_comm_->abort();
        throw CommError("rank " + std::to_string(cfg_.rank) + " of " + std::to_string(cfg_.ranks) +
                        ": " + what + " did not complete within " +
                        std::to_string(int(cfg_.comm_timeout)) +
                        " s: another rank has died, stopped, or runs a different "
                        "configuration (--comm-timeout)");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  s.synchronize();
}

// ---- gradients: device slots, streaming, host side ------------------------------------------

void Engine::begin_step(bool dpu) {
  if (dpu && !cfg_.dpu) throw std::logic_error("offload engine: DPU step without config.dpu");
  adam_->rethrow_if_failed();
  accumulator_->rethrow_if_failed();
  dpu_ = dpu;
  if (cfg_.dpu) buf_ ^= 1;  // the delayed update may still read the other buffer
  accum_sumsq_ = 0.0;
  dev_.fill_zero(stats_.data(), stats_.bytes(), *d2h_);
}

void Engine::begin_micro_batch(int a) {
  if (a < 0 || a >= cfg_.grad_accum) throw std::out_of_range("offload engine: micro-batch index");
  // Without DPU the parameters this backward reads are the updated ones: every upload must be
  // enqueued (Gpt::forward's before_read did it already, group by group).
  if (pending_ && !update_dpu_) {
    for (std::size_t g = 0; g < groups_.size(); ++g)
      ensure_uploaded(g);
  }
  micro_ = a;
  std::fill(bucket_slot_.begin(), bucket_slot_.end(), nullptr);
  next_stream_ = static_cast<long>(plan_.buckets().size()) - 1;
}

void* Engine::slot_for(std::size_t b) {
  if (bucket_slot_[b] != nullptr) return bucket_slot_[b]->buf.data();
  const Bucket& bk = plan_.buckets()[b];
  Slot* s;
  if (is_embedding(bk)) {
    s = &embed_slots_.at(b);  // embedding buckets come first in the layout
  } else {
    s = &slots_[next_slot_++ % slots_.size()];
    if (s->bucket >= 0) {
      throw std::logic_error(
          "offload engine: every device gradient slot holds a bucket still "
          "being written; raise EngineConfig::device_slots");
    }
  }
  // The copy that last read this slot must finish before it is zeroed for this bucket (padding
  // included: the reduce-scatter reads it).
  if (s->used) dev_.wait(compute_, *s->free);
  dev_.fill_zero(s->buf.data(), std::size_t(cfg_.ranks) * shards_[b].count * esize_, compute_);
  s->bucket = static_cast<long>(b);
  bucket_slot_[b] = s;
  return s->buf.data();
}

void* Engine::grad(std::size_t offset) {
  const Bucket& b = plan_.bucket_of(offset);
  return static_cast<char*>(slot_for(b.index)) + (offset - b.begin) * esize_;
}

void Engine::complete_from(std::size_t offset) {
  // Buckets are streamed in descending order; embedding buckets (the lowest) only at offset 0,
  // since wte is written again by the embedding backward.
  if (offset == 0) dev_.record(*bwd_done_, compute_);  // this backward's last op is enqueued
  while (next_stream_ >= 0) {
    const Bucket& b = plan_.buckets()[std::size_t(next_stream_)];
    if (b.begin < offset || (is_embedding(b) && offset != 0)) break;
    stream_bucket(b.index);
    --next_stream_;
  }
}

void Engine::stream_bucket(std::size_t b) {
  if (bucket_slot_[b] == nullptr) {
    throw std::logic_error("offload engine: bucket " + std::to_string(b) +
                           " is complete but backward never wrote it");
  }
  Slot& s = *bucket_slot_[b];
  const BucketShard& sh = shards_[b];
  const std::size_t count = sh.end - sh.begin, bytes = count * esize_;  // this rank's part
  const std::size_t e = std::size_t(micro_) * plan_.buckets().size() + b;
  float* stat = stats_.as<float>() + 2 * b;
  dev_.record(*bucket_ready_, compute_);
  dev_.wait(*d2h_, *bucket_ready_);
  dev_.record(*copy_begin_[e], *d2h_);
  const void* grads = s.buf.data();
  if (parallel()) {  // sum over ranks; this rank keeps its shard
    grad_comm_->reduce_scatter(s.buf.data(), s.shard.data(), sh.count, act_, *d2h_);
    grads = s.shard.data();
  }
  // The norm of a single micro-batch is the step's norm; with accumulation the host computes it.
  if (cfg_.grad_accum == 1) dev_.sum_squares(stat, grads, count, *d2h_);
  dev_.nonfinite_flag(stat + 1, grads, count, *d2h_);
  if (cfg_.grad_accum == 1) {
    char* dst = static_cast<char*>(host_grads_[buf_].data()) + sh.local * esize_;
    dev_.copy_to_host(dst, grads, bytes, *d2h_);
  } else {
    // Blocks while every ring slot is still being accumulated: back-pressure on the producer.
    auto slot = std::make_shared<pinned::BucketRing::Slot>(ring_->acquire());
    dev_.copy_to_host(slot->data(), grads, bytes, *d2h_);
    dev::Event& copied = *ring_events_[slot->index()];
    dev_.record(copied, *d2h_);
    float* acc = accum_[buf_].span<float>().data() + sh.local;
    const bool first = micro_ == 0, last = micro_ + 1 == cfg_.grad_accum;
    accumulator_->post([this, slot, &copied, acc, n = count, first, last] {
      copied.synchronize();
      const double sumsq = accumulate_grads(acc, slot->data(), act_, n, first, last);
      if (last) {
        std::lock_guard lock(accum_mu_);
        accum_sumsq_ += sumsq;
      }
      ring_->release(*slot);
    });
  }
  dev_.record(*copy_end_[e], *d2h_);
  dev_.record(*s.free, *d2h_);
  s.used = true;
  s.bucket = -1;
}

GradStats Engine::finish_gradients() {
  if (next_stream_ >= 0) {
    throw std::logic_error("offload engine: finish_gradients before backward completed");
  }
  const std::size_t nb = plan_.buckets().size();
  dev_.copy_to_host(stats_host_.data(), stats_.data(), nb * 2 * sizeof(float), *d2h_);
  dev_.record(*stats_ready_, *d2h_);
  // The stream, not just the event: it rethrows a failed collective (a rank died or diverged).
  sync_bounded(*d2h_, "the gradient reduce-scatter");
  const auto device_done = Clock::now();
  GradStats st;
  const auto stats = stats_host_.span<float>();
  for (std::size_t b = 0; b < nb; ++b) {
    st.sumsq += stats[2 * b];
    st.nonfinite = st.nonfinite || stats[2 * b + 1] != 0.0f;
  }
  double accumulate_tail_ms = 0.0;
  if (cfg_.grad_accum > 1) {
    accumulator_->wait_idle();
    accumulate_tail_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - device_done).count();
    std::lock_guard lock(accum_mu_);
    st.sumsq = accum_sumsq_;
  }
  if (parallel()) {  // this rank's shards -> the whole gradient (one small all-reduce)
    double v[2] = {st.sumsq, st.nonfinite ? 1.0 : 0.0};
    comm_->all_reduce(v, 2, comm::ReduceOp::kSum);
    st.sumsq = v[0];
    st.nonfinite = v[1] != 0.0;
    // Every upload enqueued so far is done (this step's forward waited for each group), so this
    // costs nothing; a failed all-gather among them surfaces here.
    sync_bounded(*h2d_, "the parameter all-gather");
  }
  st.nonfinite = st.nonfinite || !std::isfinite(st.sumsq);
  // Before any new upload re-records the upload events this reads.
  collect_times(accumulate_tail_ms);
  // DPU: the previous update is uploaded now, after this backward stopped reading parameters.
  if (pending_ && update_dpu_) {
    for (std::size_t g = 0; g < groups_.size(); ++g)
      ensure_uploaded(g);
  }
  return st;
}

// ---- the update and the uploads ----------------------------------------------------------------

void Engine::start_update(float lr, float grad_multiplier) {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    ensure_uploaded(g);  // the previous update's (already done without DPU or after a drain)
  adam_->wait_idle();
  const std::int64_t t = opt_.state().step + 1;
  opt_.state().step = t;
  {
    std::lock_guard lock(mu_);
    std::fill(adam_done_.begin(), adam_done_.end(), 0);
    failed_ = false;
  }
  std::fill(uploaded_.begin(), uploaded_.end(), 0);
  pending_ = true;
  update_dpu_ = dpu_;
  h2d_waited_bwd_ = false;
  const int hb = buf_;
  adam_->post([this, t, lr, grad_multiplier, hb] { run_update(t, lr, grad_multiplier, hb); });
}

void Engine::run_update(std::int64_t t, float lr, float mult, int hb) {
  const std::size_t n = opt_.size();
  const cpu_adam::ConstArrayView grads =
      cfg_.grad_accum > 1 ? cpu_adam::ConstArrayView{accum_[hb].data(), n, DType::kF32}
                          : cpu_adam::ConstArrayView{host_grads_[hb].data(), n, act_};
  cpu_adam::ArrayView out;
  if (act_ != DType::kF32) out = {upload_.data(), n, act_};
  const auto t0 = Clock::now();
  try {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      report::ScopedSpan span(trace_, "adam", "adam group " + std::to_string(int(g) - 1));
      // The previous upload of this group reads the memory this update writes.
      up_end_[g]->synchronize();
      opt_.update_range(groups_[g].begin, groups_[g].end, grads, t, lr, mult, out);
      {
        std::lock_guard lock(mu_);
        adam_done_[g] = 1;
      }
      group_cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      failed_ = true;
    }
    group_cv_.notify_all();
    throw;
  }
  std::lock_guard lock(mu_);
  adam_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void Engine::ensure_uploaded(std::size_t g) {
  if (!pending_ || uploaded_[g]) return;
  {
    std::unique_lock lock(mu_);
    group_cv_.wait(lock, [&] { return adam_done_[g] || failed_; });
    if (failed_) {
      lock.unlock();
      adam_->wait_idle();  // rethrows the Adam thread's error
      throw std::logic_error("offload engine: the Adam thread failed without an error");
    }
  }
  if (!h2d_waited_bwd_) {  // the parameters must not change under a running backward
    dev_.wait(*h2d_, *bwd_done_);
    h2d_waited_bwd_ = true;
  }
  enqueue_upload(g);
  uploaded_[g] = 1;
  up_recorded_[g] = 1;
  waited_[g] = 0;
  if (std::all_of(uploaded_.begin(), uploaded_.end(), [](char u) { return u != 0; })) {
    pending_ = false;
    uploads_to_time_ = true;
  }
}

void Engine::enqueue_upload(std::size_t g) {
  const Group& gr = groups_[g];
  // The new parameters in local order: master itself (fp32) or its 16-bit copy.
  const char* src = act_ == DType::kF32 ? reinterpret_cast<const char*>(opt_.master().data())
                                        : static_cast<const char*>(upload_.data());
  char* params = static_cast<char*>(params_.data());
  dev_.record(*up_begin_[g], *h2d_);
  if (!parallel()) {  // local order is the layout
    dev_.copy_to_device(params + gr.begin * esize_, src + gr.begin * esize_,
                        (gr.end - gr.begin) * esize_, *h2d_);
  } else {
    // Bucket by bucket (buckets are cut at groups): this rank's shard up, all ranks' shards
    // gathered, the bucket's elements (not the padding) into place.
    for (const Bucket& b : plan_.buckets()) {
      if (b.begin < gr.begin || b.begin >= gr.end) continue;
      const BucketShard& sh = shards_[b.index];
      dev_.copy_to_device(gather_in_.data(), src + sh.local * esize_, (sh.end - sh.begin) * esize_,
                          *h2d_);
      param_comm_->all_gather(gather_in_.data(), gather_out_.data(), sh.count, act_, *h2d_);
      dev_.copy_on_device(params + b.begin * esize_, gather_out_.data(), b.size() * esize_, *h2d_);
    }
  }
  dev_.record(*up_end_[g], *h2d_);
}

void Engine::before_read(int hook) {
  const std::size_t g = static_cast<std::size_t>(hook + 1);
  if (g >= groups_.size()) throw std::out_of_range("offload engine: no parameter group");
  if (pending_ && !update_dpu_) ensure_uploaded(g);
  if (waited_[g] || !up_recorded_[g]) return;
  dev_.record(*stall_begin_[g], compute_);
  dev_.wait(compute_, *up_end_[g]);
  dev_.record(*stall_end_[g], compute_);
  waited_[g] = 1;
}

void Engine::drain() {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    ensure_uploaded(g);
  adam_->wait_idle();
  sync_bounded(*h2d_, "the parameter all-gather");
}

// ---- timings
// -------------------------------------------------------------------------------------

void Engine::collect_times(double accumulate_tail_ms) {
  const std::size_t nb = plan_.buckets().size();
  PhaseTimes t;
  double last_copy = 0.0;
  for (int a = 0; a < cfg_.grad_accum; ++a) {
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t e = std::size_t(a) * nb + b;
      t.d2h += copy_end_[e]->elapsed_ms_since(*copy_begin_[e]);
      if (a + 1 == cfg_.grad_accum) {
        last_copy = std::max(last_copy, copy_end_[e]->elapsed_ms_since(*bwd_done_));
      }
      if (trace_ && trace_->enabled()) {
        trace_->span("d2h", "bucket " + std::to_string(b), clock_.us(*copy_begin_[e]),
                     clock_.us(*copy_end_[e]),
                     {{"micro_batch", a}, {"bytes", (shards_[b].end - shards_[b].begin) * esize_}});
      }
    }
  }
  t.d2h_exposed = std::max(0.0, last_copy) + accumulate_tail_ms;
  // The last update whose uploads were all enqueued and have been waited on by a forward.
  if (uploads_to_time_ &&
      std::all_of(waited_.begin(), waited_.end(), [](char w) { return w != 0; })) {
    uploads_to_time_ = false;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const double up = up_end_[g]->elapsed_ms_since(*up_begin_[g]);
      const double stall = std::max(0.0, stall_end_[g]->elapsed_ms_since(*stall_begin_[g]));
      t.h2d += up;
      t.h2d_exposed += std::min(stall, up);
      t.adam_exposed += stall - std::min(stall, up);
      if (trace_ && trace_->enabled()) {
        trace_->span("h2d", "upload group " + std::to_string(int(g) - 1), clock_.us(*up_begin_[g]),
                     clock_.us(*up_end_[g]),
                     {{"bytes", (groups_[g].end - groups_[g].begin) * esize_}});
        if (stall > 0.0) {
          trace_->span("compute", "wait params " + std::to_string(int(g) - 1),
                       clock_.us(*stall_begin_[g]), clock_.us(*stall_end_[g]));
        }
      }
    }
  }
  {
    std::lock_guard lock(mu_);
    t.adam = adam_ms_;
  }
  times_ = t;
}

}  // namespace zo::offload
