#include "offload/gradient_stream.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "device/make_device.h"
#include "offload/host_accumulate.h"

namespace zo::offload {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::unique_ptr<dev::Event>> make_events(dev::Device& d, std::size_t n) {
  std::vector<std::unique_ptr<dev::Event>> v;
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(d.create_event());
  return v;
}

}  // namespace

GradientStream::GradientStream(dev::Device& device, dev::Stream& compute, const BucketPlan& plan,
                               std::vector<BucketShard> shards, const EngineConfig& config,
                               comm::StreamComm* reduce, BoundedSync& sync)
    : dev_(device),
      compute_(compute),
      plan_(plan),
      shards_(std::move(shards)),
      cfg_(config),
      reduce_(reduce),
      sync_(sync),
      act_(device.act_dtype()),
      esize_(dtype_size(act_)),
      local_size_(local_elements(shards_)),
      d2h_(device.create_stream(/*high_priority=*/true)) {
  const std::size_t nb = plan_.buckets().size(), R = std::size_t(cfg_.ranks);
  stats_ = dev_.alloc(nb * 2 * sizeof(float), "bucket norms and overflow flags");
  own_slot_of_.assign(nb, 0);
  for (const Bucket& b : plan_.buckets()) {
    if (!b.own_slot) continue;
    own_slot_of_[b.index] = own_slots_.size();
    own_slots_.push_back(make_slot(R * shards_[b.index].count, b.embeddings
                                                                   ? "embedding gradient bucket"
                                                                   : "LM head gradient"));
  }
  for (int k = 0; k < cfg_.device_slots; ++k)
    slots_.push_back(
        make_slot(max_ring_bucket(plan_, shards_, cfg_.ranks), "gradient bucket slot"));
  bucket_slot_.assign(nb, nullptr);

  const pinned::PinOptions pin = dev::staging_pin_options(dev_, cfg_.pin);
  const int copies = cfg_.dpu ? 2 : 1;
  if (accumulates_on_host(cfg_)) {
    ring_ = std::make_unique<pinned::BucketRing>(std::size_t(cfg_.host_slots),
                                                 max_owned(shards_) * esize_, pin);
    ring_events_ = make_events(dev_, std::size_t(cfg_.host_slots));
    for (int k = 0; k < copies; ++k) {
      accum_[k] =
          pinned::HostBuffer::allocate_array<float>(local_size_, {}, cpu_adam::kChunkElements);
    }
  } else {
    for (int k = 0; k < copies; ++k)
      landing_[k] = pinned::PinnedBuffer(local_size_ * esize_, pin);
  }
  if (sums_on_device()) device_sum_ = dev_.alloc(local_size_ * sizeof(float), "fp32 gradient sum");
  stats_host_ = pinned::PinnedBuffer(nb * 2 * sizeof(float), pin);

  const std::size_t copies_per_step = std::size_t(cfg_.grad_accum) * nb;
  copy_begin_ = make_events(dev_, copies_per_step);
  copy_end_ = make_events(dev_, copies_per_step);
  bucket_ready_ = dev_.create_event();
  bwd_done_ = dev_.create_event();
  accumulator_ = std::make_unique<SerialQueue>("offload accumulate thread");
}

GradientStream::~GradientStream() {
  finish_quietly(*accumulator_, *d2h_);
}

GradientStream::Slot GradientStream::make_slot(std::size_t elements, const char* what) {
  Slot s;
  s.buf = dev_.alloc(elements * esize_, what);
  if (cfg_.ranks > 1) s.shard = dev_.alloc(elements / std::size_t(cfg_.ranks) * esize_, what);
  s.free = dev_.create_event();
  return s;
}

void GradientStream::begin_step() {
  accumulator_->rethrow_if_failed();
  if (cfg_.dpu) buf_ ^= 1;
  accum_sumsq_ = 0.0;
  dev_.fill_zero(stats_.data(), stats_.bytes(), *d2h_);
}

void GradientStream::begin_micro_batch(int a) {
  if (a < 0 || a >= cfg_.grad_accum) throw std::out_of_range("offload engine: micro-batch index");
  micro_ = a;
  std::fill(bucket_slot_.begin(), bucket_slot_.end(), nullptr);
  next_stream_ = static_cast<long>(plan_.buckets().size()) - 1;
}

void* GradientStream::slot_for(std::size_t b) {
  if (bucket_slot_[b] != nullptr) return bucket_slot_[b]->buf.data();
  Slot* s;
  if (plan_.buckets()[b].own_slot) {
    s = &own_slots_[own_slot_of_[b]];
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

void* GradientStream::grad(std::size_t offset) {
  const Bucket& b = plan_.bucket_of(offset);
  return static_cast<char*>(slot_for(b.index)) + (offset - b.begin) * esize_;
}

void GradientStream::complete_from(std::size_t offset) {
  // Buckets are streamed in descending order; embedding buckets (the lowest) only at offset 0,
  // since wte is written again by the embedding backward.
  if (offset == 0) dev_.record(*bwd_done_, compute_);  // this backward's last op is enqueued
  while (next_stream_ >= 0) {
    const Bucket& b = plan_.buckets()[std::size_t(next_stream_)];
    if (b.begin < offset || (b.embeddings && offset != 0)) break;
    stream_bucket(b.index);
    --next_stream_;
  }
}

void GradientStream::stream_bucket(std::size_t b) {
  if (bucket_slot_[b] == nullptr) {
    throw std::logic_error("offload engine: bucket " + std::to_string(b) +
                           " is complete but backward never wrote it");
  }
  Slot& s = *bucket_slot_[b];
  const BucketShard& sh = shards_[b];
  const std::size_t count = sh.end - sh.begin;  // this rank's part
  const std::size_t e = std::size_t(micro_) * plan_.buckets().size() + b;
  float* stat = stats_.as<float>() + 2 * b;
  dev_.record(*bucket_ready_, compute_);
  dev_.wait(*d2h_, *bucket_ready_);
  dev_.record(*copy_begin_[e], *d2h_);
  void* grads = s.buf.data();
  if (reduce_ != nullptr) {  // sum over ranks; this rank keeps its shard
    reduce_->reduce_scatter(s.buf.data(), s.shard.data(), sh.count, act_, *d2h_);
    grads = s.shard.data();
  }
  // Every micro-batch's gradient, before it is summed anywhere: an overflow in any one is seen.
  dev_.nonfinite_flag(stat + 1, grads, count, *d2h_);
  if (sums_on_device()) grads = add_to_device_sum(b, grads);
  if (grads != nullptr) {
    // The step's gradient itself (one micro-batch, or the device's sum): its norm is the step's.
    // Summed on the host, the host computes the norm of the sum.
    if (!accumulates_on_host(cfg_)) dev_.sum_squares(stat, grads, count, *d2h_);
    land(b, grads);
  }
  dev_.record(*copy_end_[e], *d2h_);
  dev_.record(*s.free, *d2h_);
  s.used = true;
  s.bucket = -1;
}

void* GradientStream::add_to_device_sum(std::size_t b, void* grads) {
  const BucketShard& sh = shards_[b];
  const std::size_t count = sh.end - sh.begin;
  float* sum = device_sum_.as<float>() + sh.local;
  if (micro_ == 0) {  // assigns: no pass to zero the sum first
    dev_.cast(sum, DType::kF32, grads, act_, count, *d2h_);
  } else {
    dev_.accumulate_f32(sum, grads, count, *d2h_);
  }
  if (micro_ + 1 < cfg_.grad_accum) return nullptr;
  // The slot's last reader is this stream: the rounded sum takes the bucket's place there.
  void* out = sum;
  if (act_ != DType::kF32) {
    dev_.cast(grads, act_, sum, DType::kF32, count, *d2h_);
    out = grads;
  }
  // fp16: a sum beyond the 16-bit range overflows the gradient CPU Adam would read.
  dev_.nonfinite_flag(stats_.as<float>() + 2 * b + 1, out, count, *d2h_);
  return out;
}

void GradientStream::land(std::size_t b, const void* grads) {
  const BucketShard& sh = shards_[b];
  const std::size_t count = sh.end - sh.begin, bytes = count * esize_;
  if (!accumulates_on_host(cfg_)) {
    char* dst = static_cast<char*>(landing_[buf_].data()) + sh.local * esize_;
    dev_.copy_to_host(dst, grads, bytes, *d2h_);
    return;
  }
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

GradientStream::Stats GradientStream::finish() {
  if (next_stream_ >= 0) {
    throw std::logic_error("offload engine: finish_gradients before backward completed");
  }
  const std::size_t nb = plan_.buckets().size();
  dev_.copy_to_host(stats_host_.data(), stats_.data(), nb * 2 * sizeof(float), *d2h_);
  // The stream, not just an event: it rethrows a failed collective (a rank died or diverged).
  sync_(*d2h_, "the gradient reduce-scatter");
  const auto device_done = Clock::now();
  Stats st;
  const auto stats = stats_host_.span<float>();
  for (std::size_t b = 0; b < nb; ++b) {
    st.sumsq += stats[2 * b];
    st.nonfinite = st.nonfinite || stats[2 * b + 1] != 0.0f;
  }
  accumulate_tail_ms_ = 0.0;
  if (accumulates_on_host(cfg_)) {
    accumulator_->wait_idle();
    accumulate_tail_ms_ =
        std::chrono::duration<double, std::milli>(Clock::now() - device_done).count();
    std::lock_guard lock(accum_mu_);
    st.sumsq = accum_sumsq_;
  }
  return st;
}

cpu_adam::ConstArrayView GradientStream::host_grads() const {
  if (accumulates_on_host(cfg_)) return {accum_[buf_].data(), local_size_, DType::kF32};
  return {landing_[buf_].data(), local_size_, act_};
}

GradientStream::Times GradientStream::times(report::Trace* trace,
                                            const dev::EventClock& clock) const {
  const std::size_t nb = plan_.buckets().size();
  Times t;
  double last_copy = 0.0;
  for (int a = 0; a < cfg_.grad_accum; ++a) {
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t e = std::size_t(a) * nb + b;
      t.busy += copy_end_[e]->elapsed_ms_since(*copy_begin_[e]);
      if (a + 1 == cfg_.grad_accum) {
        last_copy = std::max(last_copy, copy_end_[e]->elapsed_ms_since(*bwd_done_));
      }
      if (trace && trace->enabled()) {
        // Summed on the device, only the last micro-batch's span copies (the rest only add).
        const bool copied = !sums_on_device() || a + 1 == cfg_.grad_accum;
        trace->span("d2h", (copied ? "bucket " : "sum bucket ") + std::to_string(b),
                    clock.us(*copy_begin_[e]), clock.us(*copy_end_[e]),
                    {{"micro_batch", a},
                     {"bytes", copied ? (shards_[b].end - shards_[b].begin) * esize_ : 0}});
      }
    }
  }
  t.exposed = std::max(0.0, last_copy) + accumulate_tail_ms_;
  return t;
}

}  // namespace zo::offload
