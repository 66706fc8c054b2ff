#include "offload/upload_pipeline.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "device/make_device.h"

namespace zo::offload {

UploadPipeline::UploadPipeline(dev::Device& device, dev::Stream& compute,
                               const model::ParameterLayout& layout,
                               optim::HostOptimizer& optimizer, const BucketPlan& plan,
                               const std::vector<BucketShard>& shards, const EngineConfig& config,
                               comm::StreamComm* gather, BoundedSync& sync, report::Trace* trace)
    : dev_(device),
      compute_(compute),
      layout_(layout),
      opt_(optimizer),
      plan_(plan),
      shards_(shards),
      gather_(gather),
      sync_(sync),
      trace_(trace),
      act_(device.act_dtype()),
      esize_(dtype_size(act_)),
      h2d_(device.create_stream(/*high_priority=*/true)) {
  if (config.param_window > 0) {
    if (gather_ != nullptr || config.dpu) {
      throw std::invalid_argument(
          "stream mode (a parameter window) runs one rank without DPU: data parallelism would "
          "need a per-group all-gather into the window, and a delayed update a second host copy "
          "of the parameters (the next step reads the old ones while Adam writes the new)");
    }
    window_ = std::make_unique<ParamWindow>(dev_, compute_, *h2d_, layout, config.param_window,
                                            config.poison_window);
  } else {
    params_ = dev_.alloc(layout.size() * esize_, "parameters");
  }
  if (gather_ != nullptr) {
    const std::size_t count = max_shard(shards_);
    gather_in_ = dev_.alloc(count * esize_, "parameter shard for the all-gather");
    gather_out_ = dev_.alloc(std::size_t(config.ranks) * count * esize_, "all-gathered parameters");
    dev_.fill_zero(gather_in_.data(), gather_in_.bytes(), *h2d_);  // the padding is never garbage
  }
  if (config.master != opt_.master_dtype() || config.state_on_drive != opt_.on_drive()) {
    throw std::logic_error(
        "offload engine: EngineConfig's master or state place is not the "
        "optimizer's");
  }
  if (!uploads_from_master()) {
    upload_ =
        pinned::PinnedBuffer(opt_.size() * esize_, dev::staging_pin_options(dev_, config.pin));
  }
  for (const model::Range& r : layout.groups()) {
    Group g;
    g.range = r;
    g.up_begin = dev_.create_event();
    g.up_end = dev_.create_event();
    g.stall_begin = dev_.create_event();
    g.stall_end = dev_.create_event();
    groups_.push_back(std::move(g));
  }
  adam_done_.assign(groups_.size(), 0);
  adam_ = std::make_unique<SerialQueue>("offload Adam thread");
}

bool UploadPipeline::uploads_from_master() const {
  return act_ == opt_.master_dtype() && !opt_.on_drive();
}

UploadPipeline::~UploadPipeline() {
  finish_quietly(*adam_, *h2d_);
}

bool UploadPipeline::any_pending() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.pending; });
}

void UploadPipeline::upload_all() {
  drain();
  if (!uploads_from_master()) opt_.copy_master_as(0, layout_.size(), act_, upload_.data());
  for (std::size_t g = 0; g < groups_.size(); ++g)
    enqueue_upload(g);
  sync_(*h2d_, "the parameter all-gather");
}

void UploadPipeline::start(cpu_adam::ConstArrayView grads, std::int64_t t, float lr,
                           float grad_multiplier, bool delayed, dev::Event& backward_done) {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    enqueue(g);  // the previous update's (already done without DPU, or after a drain)
  adam_->wait_idle();
  {
    std::lock_guard lock(mu_);
    std::fill(adam_done_.begin(), adam_done_.end(), 0);
    failed_ = false;
  }
  for (Group& g : groups_)
    g.pending = true;
  delayed_ = delayed;
  fenced_ = false;
  backward_done_ = &backward_done;
  adam_->post([this, grads, t, lr, grad_multiplier] { run_update(grads, t, lr, grad_multiplier); });
}

void UploadPipeline::run_update(cpu_adam::ConstArrayView grads, std::int64_t t, float lr,
                                float mult) {
  // The update writes the uploads' copy as it goes: 16-bit from the kernels, fp32 (the host
  // backend, with a bf16 master or one on a drive) from the new master of each piece it updated.
  cpu_adam::ArrayView out;
  if (!uploads_from_master()) out = {upload_.data(), opt_.size(), act_};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      report::ScopedSpan span(trace_, "adam", "adam " + layout_.group_name(g));
      // The previous upload of this group reads the memory this update writes.
      groups_[g].up_end->synchronize();
      const model::Range& r = groups_[g].range;
      opt_.update_range(r.begin, r.end, grads, t, lr, mult, out);
      {
        std::lock_guard lock(mu_);
        adam_done_[g] = 1;
      }
      done_cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      failed_ = true;
    }
    done_cv_.notify_all();
    throw;
  }
  {
    std::lock_guard lock(mu_);
    adam_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  // A state on a drive: the next update's first chunks are read while the device works (a write
  // that fails here surfaces through the Adam thread as any update's would).
  opt_.read_ahead_first_chunks();
}

void UploadPipeline::enqueue(std::size_t g) {
  Group& gr = groups_[g];
  if (!gr.pending) return;
  {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return adam_done_[g] || failed_; });
    if (failed_) {
      lock.unlock();
      adam_->wait_idle();  // rethrows the Adam thread's error
      throw std::logic_error("offload engine: the Adam thread failed without an error");
    }
  }
  if (!fenced_) {  // the parameters must not change under a running backward
    dev_.wait(*h2d_, *backward_done_);
    fenced_ = true;
  }
  enqueue_upload(g);
  gr.pending = false;
  gr.enqueued = true;
  if (!any_pending()) untimed_ = true;
}

void UploadPipeline::enqueue_upload(std::size_t g) {
  const model::Range& gr = groups_[g].range;
  const char* src = static_cast<const char*>(upload_source());
  if (window_ && !ParamWindow::resident(layout_, g)) {  // copied when the pass needs it
    window_->invalidate(g);
    return;
  }
  char* params = window_ ? static_cast<char*>(window_->resident_base(g)) - gr.begin * esize_
                         : static_cast<char*>(params_.data());
  dev_.record(*groups_[g].up_begin, *h2d_);
  if (gather_ == nullptr) {  // local order is the layout
    dev_.copy_to_device(params + gr.begin * esize_, src + gr.begin * esize_, gr.size() * esize_,
                        *h2d_);
  } else {
    // Bucket by bucket (buckets are cut at groups): this rank's shard up, all ranks' shards
    // gathered, the bucket's elements (not the padding) into place.
    for (const Bucket& b : plan_.buckets()) {
      if (b.begin < gr.begin || b.begin >= gr.end) continue;
      const BucketShard& sh = shards_[b.index];
      dev_.copy_to_device(gather_in_.data(), src + sh.local * esize_, (sh.end - sh.begin) * esize_,
                          *h2d_);
      gather_->all_gather(gather_in_.data(), gather_out_.data(), sh.count, act_, *h2d_);
      dev_.copy_on_device(params + b.begin * esize_, gather_out_.data(), b.size() * esize_, *h2d_);
    }
  }
  dev_.record(*groups_[g].up_end, *h2d_);
}

const void* UploadPipeline::upload_source() const {
  // The new parameters in local order: the master itself (in the act dtype) or its copy.
  return uploads_from_master() ? opt_.master_data() : upload_.data();
}

bool UploadPipeline::adam_finished(std::size_t g) {
  if (!groups_[g].pending) return true;
  std::lock_guard lock(mu_);
  return adam_done_[g] != 0;
}

void UploadPipeline::stream_in(std::size_t g) {
  Group& gr = groups_[g];
  dev_.record(*gr.stall_begin, compute_);
  if (ParamWindow::resident(layout_, g) && gr.enqueued) dev_.wait(compute_, *gr.up_end);
  // A group Adam has not written yet is not prefetched: it is filled when it is needed.
  window_->enter(
      g, upload_source(),
      [&](std::size_t h) {
        if (!adam_finished(h)) return false;
        enqueue(h);
        return true;
      },
      [&](std::size_t h) {
        return ParamWindow::FillEvents{*groups_[h].up_begin, *groups_[h].up_end};
      });
  dev_.record(*gr.stall_end, compute_);
  gr.enqueued = false;
}

void UploadPipeline::before_read(std::size_t g) {
  if (g >= groups_.size()) throw std::out_of_range("offload engine: no parameter group");
  if (!delayed_) enqueue(g);
  if (window_) {
    stream_in(g);
    return;
  }
  Group& gr = groups_[g];
  if (!gr.enqueued) return;
  dev_.record(*gr.stall_begin, compute_);
  dev_.wait(compute_, *gr.up_end);
  dev_.record(*gr.stall_end, compute_);
  gr.enqueued = false;
}

void UploadPipeline::before_backward() {
  if (delayed_) return;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    enqueue(g);
}

void UploadPipeline::after_backward() {
  if (!delayed_) return;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    enqueue(g);
}

void UploadPipeline::drain() {
  for (std::size_t g = 0; g < groups_.size(); ++g)
    enqueue(g);
  adam_->wait_idle();
  sync_(*h2d_, "the parameter all-gather");
}

UploadPipeline::Times UploadPipeline::times(report::Trace* trace, const dev::EventClock& clock) {
  Times t;
  {
    std::lock_guard lock(mu_);
    t.adam = adam_ms_;
  }
  // The last update whose uploads were all enqueued and have been waited on by a forward.
  const bool waited =
      std::none_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.enqueued; });
  if (!untimed_ || !waited) return t;
  untimed_ = false;
  const bool tracing = trace != nullptr && trace->enabled();
  if (window_) {  // stream mode: every block copy since the last timing (resident groups below)
    for (const ParamWindow::Copy& c : window_->take_copies()) {
      if (!c.end->query()) continue;  // a prefetch still running: left out of this timing
      t.h2d += c.end->elapsed_ms_since(*c.begin);
      if (tracing) {
        trace->span("h2d", "copy " + layout_.group_name(c.group), clock.us(*c.begin),
                    clock.us(*c.end), {{"bytes", groups_[c.group].range.size() * esize_}});
      }
    }
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const Group& gr = groups_[g];
    const bool copied_above = window_ && !ParamWindow::resident(layout_, g);
    const double up = gr.up_end->elapsed_ms_since(*gr.up_begin);
    const double stall = std::max(0.0, gr.stall_end->elapsed_ms_since(*gr.stall_begin));
    if (!copied_above) t.h2d += up;
    t.h2d_exposed += std::min(stall, up);
    t.adam_exposed += stall - std::min(stall, up);
    if (tracing) {
      if (!copied_above) {
        trace->span("h2d", "upload " + layout_.group_name(g), clock.us(*gr.up_begin),
                    clock.us(*gr.up_end), {{"bytes", gr.range.size() * esize_}});
      }
      if (stall > 0.0) {
        trace->span("compute", "wait params " + layout_.group_name(g), clock.us(*gr.stall_begin),
                    clock.us(*gr.stall_end));
      }
    }
  }
  return t;
}

}  // namespace zo::offload
