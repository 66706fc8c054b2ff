// The gradient half of the offload engine (docs/offload.md): backward writes each bucket into a
// device slot; once the bucket is final it is streamed on the D2H stream (data parallel: reduce-
// scattered first, so only this rank's shard moves), its sum of squares and non-finite flag are
// reduced on the device, and it lands in pinned host memory: in the landing buffer (one
// micro-batch), or through a pinned ring to the accumulate thread, which adds it into fp32 host
// gradients (--grad-accum > 1, summed on the host). Summed on the device instead
// (EngineConfig::accumulate_on_device), each micro-batch's bucket is added into an fp32 sum of
// this rank's shards and only the last micro-batch sends a bucket: the sum rounded once to the
// act dtype, down the one-micro-batch path. No full-size 16-bit gradient buffer exists on the
// device.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/stream_comm.h"
#include "core/serial_queue.h"
#include "cpu_adam/cpu_adam.h"
#include "device/device.h"
#include "device/event_clock.h"
#include "offload/bounded_sync.h"
#include "offload/bucket_plan.h"
#include "offload/engine_config.h"
#include "pinned_memory/bucket_ring.h"
#include "pinned_memory/host_buffer.h"
#include "pinned_memory/pinned_buffer.h"
#include "report/trace.h"

namespace zo::offload {

class GradientStream {
 public:
  // `reduce`: the collectives of the D2H stream (null with one rank). Allocates the device slots
  // and the host staging of EngineConfig (engine_footprint counts the same bytes).
  GradientStream(dev::Device& device, dev::Stream& compute, const BucketPlan& plan,
                 std::vector<BucketShard> shards, const EngineConfig& config,
                 comm::StreamComm* reduce, BoundedSync& sync);
  ~GradientStream();  // waits for the accumulate thread; never throws
  GradientStream(const GradientStream&) = delete;
  GradientStream& operator=(const GradientStream&) = delete;

  dev::Stream& stream() { return *d2h_; }
  // Before a step's first micro-batch: with DPU the landing buffers alternate, since the delayed
  // update of the previous step may still read the other one.
  void begin_step();
  void begin_micro_batch(int a);  // before micro-batch a's backward is enqueued

  // The model's gradient side (model::ParameterStore).
  void* grad(std::size_t offset);
  void complete_from(std::size_t offset);
  // Recorded on the compute stream after this backward's last op (complete_from(0)).
  dev::Event& backward_done() { return *bwd_done_; }

  // After the last micro-batch's backward: blocks until the step's gradients are on the host
  // (the step's only host synchronisation). This rank's shards' sum of squares and flag.
  struct Stats {
    double sumsq = 0.0;
    bool nonfinite = false;
  };
  Stats finish();
  // This step's gradients on the host, in local order: the landing buffer (act dtype) or, summed
  // on the host, the fp32 accumulators. Valid until the step after next begins (DPU) or the next
  // one (without).
  cpu_adam::ConstArrayView host_grads() const;

  // The finished step's D2H busy time and the gradient tail after backward (ms); its copies go
  // to the trace.
  struct Times {
    double busy = 0.0, exposed = 0.0;
  };
  Times times(report::Trace* trace, const dev::EventClock& clock) const;

 private:
  struct Slot {                        // a device gradient slot
    dev::Buffer buf;                   // a bucket, padded to ranks x shard count
    dev::Buffer shard;                 // data parallel: this rank's reduced shard
    std::unique_ptr<dev::Event> free;  // the last copy out of it completed
    bool used = false;                 // `free` has been recorded
    long bucket = -1;                  // bucket it holds until streamed, -1 none
  };
  Slot make_slot(std::size_t elements, const char* what);
  void* slot_for(std::size_t bucket);
  void stream_bucket(std::size_t bucket);
  bool sums_on_device() const { return cfg_.grad_accum > 1 && cfg_.accumulate_on_device; }
  // Into the device sum; at the last micro-batch the rounded sum to send, else null.
  void* add_to_device_sum(std::size_t bucket, void* grads);
  void land(std::size_t bucket, const void* grads);  // the copy to the host (and accumulation)

  dev::Device& dev_;
  dev::Stream& compute_;
  const BucketPlan& plan_;
  std::vector<BucketShard> shards_;  // per bucket: this rank's part (the bucket with one rank)
  EngineConfig cfg_;
  comm::StreamComm* reduce_;
  BoundedSync& sync_;
  DType act_;
  std::size_t esize_, local_size_;
  std::unique_ptr<dev::Stream> d2h_;

  dev::Buffer stats_;            // (buckets, 2) fp32: sum of squares, non-finite flag
  dev::Buffer device_sum_;       // (local) fp32: micro-batches summed on the device, or none
  std::vector<Slot> own_slots_;  // one per Bucket::own_slot bucket (embeddings, untied head)
  std::vector<std::size_t> own_slot_of_;  // per bucket: its index in own_slots_
  std::vector<Slot> slots_;               // the ring every other bucket cycles through
  std::size_t next_slot_ = 0;
  std::vector<Slot*> bucket_slot_;  // bucket -> its slot this micro-batch, or null
  long next_stream_ = -1;           // highest bucket not yet streamed this micro-batch
  int micro_ = 0;

  // Host staging, in local order; two of each with DPU.
  pinned::PinnedBuffer landing_[2];                       // one bucket per step: act dtype
  std::unique_ptr<pinned::BucketRing> ring_;              // summed on the host: buckets to add
  std::vector<std::unique_ptr<dev::Event>> ring_events_;  // per ring slot: copy landed
  pinned::HostBuffer accum_[2];                           // summed on the host: fp32
  pinned::PinnedBuffer stats_host_;
  int buf_ = 0;
  std::mutex accum_mu_;
  double accum_sumsq_ = 0.0;  // guarded by accum_mu_
  double accumulate_tail_ms_ = 0.0;

  // Per (micro-batch, bucket) copy begin/end, and the end of each backward.
  std::vector<std::unique_ptr<dev::Event>> copy_begin_, copy_end_;
  std::unique_ptr<dev::Event> bucket_ready_, bwd_done_;

  std::unique_ptr<SerialQueue> accumulator_;  // last: joined first
};

}  // namespace zo::offload
