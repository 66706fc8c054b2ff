// The parameter half of the offload engine (docs/offload.md): CPU Adam runs on its own thread
// group by group in forward order (ParameterLayout::groups()) and writes the new 16-bit
// parameters into a pinned upload buffer; each finished group is uploaded on the H2D stream
// (data parallel: this rank's shard of each bucket, then an all-gather), and the next forward
// waits for a group's upload only when it is about to read that group.
//
// Every group goes through the same states for each update:
//   pending   the update in flight has not been enqueued for upload (Adam may still be on it)
//   enqueued  its upload is on the H2D stream; the compute stream has not waited for it yet
//   current   the compute stream has waited for the upload: forward reads the new parameters
// enqueue() is the one place an upload of an update is enqueued. Without DPU, forward's
// before_read(g) enqueues group g as soon as Adam finished it; with DPU (ZeRO-Offload §5.2,
// arXiv 2101.06840) the update overlaps the next step's forward and backward, which read the
// previous parameters, and after_backward() enqueues every group.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/stream_comm.h"
#include "core/serial_queue.h"
#include "cpu_adam/cpu_adam.h"
#include "device/device.h"
#include "device/event_clock.h"
#include "model/layout.h"
#include "offload/bounded_sync.h"
#include "offload/bucket_plan.h"
#include "offload/engine_config.h"
#include "offload/param_window.h"
#include "optim/host_optimizer.h"
#include "pinned_memory/pinned_buffer.h"
#include "report/trace.h"

namespace zo::offload {

class UploadPipeline {
 public:
  // `gather`: the collectives of the H2D stream (null with one rank). Allocates the device
  // parameters, the pinned upload buffer and (data parallel) the all-gather buffers.
  UploadPipeline(dev::Device& device, dev::Stream& compute, const model::ParameterLayout& layout,
                 optim::HostOptimizer& optimizer, const BucketPlan& plan,
                 const std::vector<BucketShard>& shards, const EngineConfig& config,
                 comm::StreamComm* gather, BoundedSync& sync, report::Trace* trace);
  ~UploadPipeline();  // waits for the Adam thread and the uploads; never throws
  UploadPipeline(const UploadPipeline&) = delete;
  UploadPipeline& operator=(const UploadPipeline&) = delete;

  // (n) act dtype, device; null in stream mode (EngineConfig::param_window).
  const void* params() const { return params_.data(); }
  const void* param(std::size_t offset) const {
    if (window_) return window_->param(offset);
    return static_cast<const char*>(params_.data()) + offset * esize_;
  }
  dev::Stream& stream() { return *h2d_; }
  void rethrow_if_failed() { adam_->rethrow_if_failed(); }

  // Uploads all of the master weights now (initialisation, resume) and waits for it.
  void upload_all();
  // Starts update number t on the Adam thread from `grads` (local order; they must stay valid
  // until the update finished) once the previous update's uploads are enqueued. Its uploads wait
  // for `backward_done`: parameters never change under a running backward. delayed: DPU.
  void start(cpu_adam::ConstArrayView grads, std::int64_t t, float lr, float grad_multiplier,
             bool delayed, dev::Event& backward_done);
  // Forward is about to read group g.
  void before_read(std::size_t g);
  // Backward is about to be enqueued (not delayed: every upload must be enqueued by now).
  void before_backward();
  // Backward has ended (delayed: the update's uploads are enqueued now).
  void after_backward();
  // Finishes the running update and its uploads (checkpoints, evaluation, the end of a run).
  void drain();

  // Adam's busy time of the last update, and, once the compute stream has waited for every
  // group of an update, the uploads' busy time and the stalls they caused (ms); spans go to the
  // trace.
  struct Times {
    double adam = 0, h2d = 0, adam_exposed = 0, h2d_exposed = 0;
  };
  Times times(report::Trace* trace, const dev::EventClock& clock);

 private:
  struct Group {
    model::Range range;
    bool pending = false;   // the update in flight is not enqueued for upload yet
    bool enqueued = false;  // an upload is enqueued that the compute stream has not waited for
    std::unique_ptr<dev::Event> up_begin, up_end, stall_begin, stall_end;
  };
  void enqueue(std::size_t g);         // the update's upload of group g, once Adam is done
  void enqueue_upload(std::size_t g);  // copies (and gathers) group g on the H2D stream
  // Stream mode's before_read: group g into the window (filled now if no prefetch did it), the
  // compute stream waiting for it, and the next groups of the pass prefetched.
  void stream_in(std::size_t g);
  bool adam_finished(std::size_t g);  // update in flight has written group g (or none in flight)
  const void* upload_source() const;  // what uploads copy: the master or its 16-bit copy
  // Uploads read the master itself: it is in the act dtype and in memory.
  bool uploads_from_master() const;
  void run_update(cpu_adam::ConstArrayView grads, std::int64_t t, float lr, float mult);
  bool any_pending() const;

  dev::Device& dev_;
  dev::Stream& compute_;
  const model::ParameterLayout& layout_;
  optim::HostOptimizer& opt_;
  const BucketPlan& plan_;
  const std::vector<BucketShard>& shards_;
  comm::StreamComm* gather_;
  BoundedSync& sync_;
  report::Trace* trace_;
  DType act_;
  std::size_t esize_;
  std::unique_ptr<dev::Stream> h2d_;
  dev::Buffer params_;                   // (n) act dtype
  dev::Buffer gather_in_, gather_out_;   // (count), (ranks, count): one bucket's all-gather
  pinned::PinnedBuffer upload_;          // 16-bit params in local order (fp32 uploads read master)
  std::unique_ptr<ParamWindow> window_;  // stream mode: instead of params_
  std::vector<Group> groups_;

  // The update in flight. adam_done_, failed_ and adam_ms_ are shared with the Adam thread.
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::vector<char> adam_done_;
  bool failed_ = false;
  double adam_ms_ = 0.0;
  // Main thread only.
  bool delayed_ = false;  // DPU: uploads wait for after_backward()
  bool fenced_ = false;   // the H2D stream waits for the backward of this update
  dev::Event* backward_done_ = nullptr;
  bool untimed_ = false;  // every upload of an update enqueued, not yet timed

  std::unique_ptr<SerialQueue> adam_;  // last: joined first
};

}  // namespace zo::offload
