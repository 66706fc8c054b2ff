// The ZeRO-Offload engine (DESIGN.md §2, §5; docs/offload.md): the device keeps only
// 16-bit parameters, activations and a few gradient buckets; the host keeps fp32 master
// weights, Adam m and v. One step:
//
//   compute stream  fwd(l waits upload l) ... bwd: writes each bucket into a device slot
//   d2h stream          per complete bucket: norm + overflow flag (device), copy to pinned host
//   accumulate thread   (grad_accum > 1) fp32 host gradients += bucket
//   adam thread         after the last micro-batch: CPU Adam group by group in forward order,
//                       16-bit params into the pinned upload buffer
//   h2d stream          uploads each finished group; the next forward waits only on its group
//
// With DPU (ZeRO-Offload §5.2, arXiv 2101.06840) the update of step t runs while step t+1's
// forward and backward run on parameters one step stale; its uploads wait for that backward.
// The engine is backend-agnostic: on the host backend streams are threads, so CI runs all of it.
//
// Data parallel (ZeRO-2 with offload, docs/scale_out.md): every bucket is reduce-scattered on
// the d2h stream before its copy, so only this rank's shard goes to the host; the optimizer
// holds only this rank's shards; an upload copies the rank's shard of each bucket of a group
// and all-gathers the group's parameters on the h2d stream. Norm and overflow flag are summed
// over ranks in finish_gradients (one small all-reduce).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/comm.h"
#include "comm/stream_comm.h"
#include "core/serial_queue.h"
#include "device/device.h"
#include "device/event_clock.h"
#include "model/gpt.h"
#include "model/layout.h"
#include "offload/bucket_plan.h"
#include "offload/host_optimizer.h"
#include "pinned_memory/bucket_ring.h"
#include "pinned_memory/pinned_buffer.h"
#include "report/trace.h"

namespace zo::offload {

struct EngineConfig {
  // Gradient bytes per bucket (act dtype). 32 MiB: large enough that a copy runs at full PCIe
  // bandwidth, small enough that the last bucket's copy adds little after backward.
  std::size_t bucket_bytes = std::size_t{32} << 20;
  int grad_accum = 1;           // micro-batches per step; > 1 accumulates on the host in fp32
  bool pin = true;              // page-lock host staging buffers (off: pageable, copies not async)
  int device_slots = 3;         // device ring of bucket-sized gradient slots (>= 2)
  int host_slots = 4;           // pinned ring for accumulation (grad_accum > 1)
  bool dpu = false;             // allocate for delayed updates (begin_step(true) delays a step)
  int ranks = 1, rank = 0;      // data parallel: the job's ranks and this one
  double comm_timeout = 300.0;  // seconds NCCL initialisation may wait for the other ranks
};

// The bucket plan the engine uses (buckets cut at group boundaries when ranks > 1) and this
// rank's optimizer partition under it; the HostOptimizer must be built with the latter.
BucketPlan engine_bucket_plan(const model::ParameterLayout& layout, DType act,
                              const EngineConfig& config);
std::vector<OwnedRange> engine_partition(const model::ParameterLayout& layout, DType act,
                                         const EngineConfig& config);

// Device and host bytes the engine allocates (for the planner; equals what it allocates).
struct EngineFootprint {
  std::size_t device_grad_slots = 0, device_stats = 0;  // parameters: n x act dtype
  std::size_t device_comm = 0;  // data parallel: shard slots and the all-gather buffers
  std::size_t host_grads = 0;   // pinned landing buffer(s), act dtype (grad_accum == 1)
  std::size_t host_ring = 0;    // pinned accumulation ring (grad_accum > 1)
  std::size_t host_accum = 0;   // fp32 accumulators (grad_accum > 1)
  std::size_t host_upload = 0;  // pinned 16-bit upload buffer (16-bit act dtypes)
};
EngineFootprint engine_footprint(const model::ParameterLayout& layout, DType act,
                                 const EngineConfig& config);

struct GradStats {
  double sumsq = 0.0;      // squared L2 norm of the (loss-scaled) step gradient
  bool nonfinite = false;  // some gradient was Inf or NaN
};

// Milliseconds for one step. Busy: how long each pipeline stage worked. Exposed: how long the
// step was delayed by it: d2h = gradient tail after backward ended; adam and h2d = time the
// compute stream stalled waiting for parameters (split: the part while the upload itself ran is
// h2d, the rest adam).
struct PhaseTimes {
  double d2h = 0, adam = 0, h2d = 0;
  double d2h_exposed = 0, adam_exposed = 0, h2d_exposed = 0;
};

class Engine final : public model::GradSink {
 public:
  // Allocates the device parameters, gradient slots and host staging. `compute` is the stream
  // forward and backward run on. The optimizer's master weights are the source of truth.
  // config.ranks > 1 needs `comm` (config.ranks ranks; a collective call: every rank builds its
  // engine at the same point) and an optimizer over engine_partition().
  Engine(dev::Device& device, dev::Stream& compute, const model::ParameterLayout& layout,
         HostOptimizer& optimizer, const EngineConfig& config, report::Trace* trace = nullptr,
         comm::Communicator* comm = nullptr);
  ~Engine() override;  // waits for in-flight work; never throws
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const BucketPlan& plan() const { return plan_; }
  void* params() const { return params_.data(); }  // (n) act dtype, device
  // Uploads all of the master weights now (initialisation, resume) and waits for it.
  void upload_all();

  // ---- a step ---------------------------------------------------------------------------------
  // dpu: this step's update is delayed (needs config.dpu). Call before the first micro-batch.
  void begin_step(bool dpu);
  // Before micro-batch a's backward is enqueued (a = 0 .. grad_accum-1).
  void begin_micro_batch(int a);
  void* grad(std::size_t offset) override;          // GradSink for Gpt::backward
  void complete_from(std::size_t offset) override;  // streams finished buckets
  // After the last micro-batch's backward: blocks until the step's gradients are on the host
  // (and, with DPU, uploads the previous update). The only host synchronisation of the step.
  GradStats finish_gradients();
  // Starts update number optimizer.state().step + 1 on the Adam thread and returns; every
  // gradient is multiplied by grad_multiplier (1/loss_scale x clip) inside the Adam pass.
  void start_update(float lr, float grad_multiplier);
  // Gpt::forward's before_read hook: the compute stream waits for group g's upload only.
  void before_read(int group);
  // Finishes the running update and its uploads (checkpoints, evaluation, the end of a run).
  void drain();
  PhaseTimes phase_times() const { return times_; }

 private:
  struct Group {  // an upload unit: embeddings, block l, or ln_f
    std::size_t begin, end;
  };
  struct Slot {                        // a device gradient slot
    dev::Buffer buf;                   // a bucket, padded to ranks x shard count
    dev::Buffer shard;                 // data parallel: this rank's reduced shard
    std::unique_ptr<dev::Event> free;  // the last copy out of it completed
    bool used = false;                 // `free` has been recorded
    long bucket = -1;                  // bucket it holds until streamed, -1 none
  };

  bool parallel() const { return cfg_.ranks > 1; }
  Slot make_slot(std::size_t elements, const char* what);
  void* slot_for(std::size_t bucket);
  void stream_bucket(std::size_t bucket);
  void enqueue_upload(std::size_t group);
  // Waits for everything enqueued on s so far and rethrows its errors; data parallel: bounded
  // by config.comm_timeout, after which the collectives are aborted and CommError thrown.
  void sync_bounded(dev::Stream& s, const char* what);
  void run_update(std::int64_t t, float lr, float mult, int host_buf);  // on the Adam thread
  void ensure_uploaded(std::size_t group);
  void collect_times(double accumulate_tail_ms);

  dev::Device& dev_;
  dev::Stream& compute_;
  const model::ParameterLayout& layout_;
  HostOptimizer& opt_;
  EngineConfig cfg_;
  report::Trace* trace_;
  BucketPlan plan_;
  DType act_;
  std::size_t esize_;
  std::vector<BucketShard> shards_;  // per bucket: this rank's part (the bucket with one rank)
  std::vector<Group> groups_;        // [0] embeddings, [1 + l] block l, [L + 1] ln_f
  comm::Communicator* comm_;
  std::unique_ptr<comm::StreamComm> grad_comm_, param_comm_;  // on d2h_, h2d_
  dev::Buffer gather_in_,
      gather_out_;  // (count), (ranks, count) act dtype: one bucket's all-gather
  std::unique_ptr<dev::Stream> d2h_, h2d_;
  dev::Buffer params_;             // (n) act dtype
  dev::Buffer stats_;              // (buckets, 2) fp32: sum of squares, non-finite flag
  std::vector<Slot> embed_slots_;  // one per embedding bucket (written first and last)
  std::vector<Slot> slots_;        // the ring every other bucket cycles through
  std::size_t next_slot_ = 0;
  std::vector<Slot*> bucket_slot_;  // bucket -> its slot this micro-batch, or null
  long next_stream_ = -1;           // highest bucket not yet streamed this micro-batch
  int micro_ = 0;

  // Host staging, in local order (this rank's shards; the layout with one rank). Two of each
  // with DPU: the delayed update reads one while the next lands.
  pinned::PinnedBuffer host_grads_[2];                    // grad_accum == 1: act dtype (n)
  std::unique_ptr<pinned::BucketRing> ring_;              // grad_accum > 1: buckets to accumulate
  std::vector<std::unique_ptr<dev::Event>> ring_events_;  // per ring slot: copy landed
  pinned::HostBuffer accum_[2];                           // grad_accum > 1: fp32 (n)
  pinned::PinnedBuffer upload_;  // 16-bit params (fp32 uploads read master)
  pinned::PinnedBuffer stats_host_;
  int buf_ = 0;
  std::mutex accum_mu_;
  double accum_sumsq_ = 0.0;  // guarded by accum_mu_

  // Events: per (micro-batch, bucket) copy begin/end; per group upload begin/end and compute
  // stall begin/end; the rest one each.
  std::vector<std::unique_ptr<dev::Event>> copy_begin_, copy_end_;
  std::vector<std::unique_ptr<dev::Event>> up_begin_, up_end_, stall_begin_, stall_end_;
  std::unique_ptr<dev::Event> bucket_ready_, bwd_done_, stats_ready_, synced_;
  dev::EventClock clock_;  // device events on the trace's timeline

  // The update in flight. adam_done_ and failed_ are shared with the Adam thread (mu_).
  std::mutex mu_;
  std::condition_variable group_cv_;
  std::vector<char> adam_done_;
  bool failed_ = false;
  double adam_ms_ = 0.0;
  // Main thread only.
  std::vector<char> uploaded_, up_recorded_, waited_;
  bool pending_ = false;  // an update with uploads not yet enqueued
  bool dpu_ = false, update_dpu_ = false;
  bool h2d_waited_bwd_ = false;
  bool uploads_to_time_ = false;
  PhaseTimes times_;

  std::unique_ptr<SerialQueue> accumulator_, adam_;  // last: joined first
};

}  // namespace zo::offload
