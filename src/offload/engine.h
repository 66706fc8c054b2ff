// The ZeRO-Offload engine (arXiv 2101.06840; docs/offload.md): the device keeps only the
// parameters in act dtype, activations and a few gradient buckets; the host keeps fp32 master
// weights and Adam m and v (optim::HostOptimizer). One step:
//
//   compute stream     fwd (group g waits for its upload) ... bwd writes buckets into slots
//   d2h stream         per final bucket: norm + overflow flag, copy to pinned host  } gradient_
//                      (grad_accum > 1 on the device: fp32 sum += bucket, the last  } stream.h
//                      micro-batch copies the sum rounded once)                     }
//   accumulate thread  (grad_accum > 1 on the host) fp32 host gradients += bucket   }
//   Adam thread        CPU Adam group by group in forward order                     } upload_
//   h2d stream         uploads each finished group                                   } pipeline.h
//
// The engine is the façade: it owns the two halves, is the model's ParameterStore, and adds
// what spans both (the step's statistics over ranks, phase times). It is backend-agnostic: on the
// host backend streams are threads, so CI runs all of it.
//
// Data parallel (ZeRO-2 with offload, docs/scale_out.md): buckets are reduce-scattered before
// their copy, the optimizer holds only this rank's shards, uploads all-gather; the norm and
// overflow flag are summed over ranks in finish_gradients (one small all-reduce).
#pragma once

#include <cstddef>
#include <memory>

#include "comm/comm.h"
#include "comm/stream_comm.h"
#include "device/device.h"
#include "device/event_clock.h"
#include "model/layout.h"
#include "model/parameter_store.h"
#include "offload/bounded_sync.h"
#include "offload/bucket_plan.h"
#include "offload/engine_config.h"
#include "offload/gradient_stream.h"
#include "offload/upload_pipeline.h"
#include "optim/host_optimizer.h"
#include "report/trace.h"

namespace zo::offload {

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

class Engine final : public model::ParameterStore {
 public:
  // `compute` is the stream forward and backward run on. The optimizer's master weights are the
  // source of truth. config.ranks > 1 needs `comm` (a collective call: every rank builds its
  // engine at the same point) and an optimizer over engine_partition().
  Engine(dev::Device& device, dev::Stream& compute, const model::ParameterLayout& layout,
         optim::HostOptimizer& optimizer, const EngineConfig& config,
         report::Trace* trace = nullptr, comm::Communicator* comm = nullptr);
  ~Engine() override;  // waits for in-flight work; never throws
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const BucketPlan& plan() const { return plan_; }
  // Uploads all of the master weights now (initialisation, resume) and waits for it.
  void upload_all() { uploads_->upload_all(); }

  // ---- a step ---------------------------------------------------------------------------------
  // dpu: this step's update is delayed (needs config.dpu). Call before the first micro-batch.
  void begin_step(bool dpu);
  // Before micro-batch a's backward is enqueued (a = 0 .. grad_accum-1).
  void begin_micro_batch(int a);
  // model::ParameterStore: what the model's forward and backward read and write.
  const void* param(std::size_t offset) override { return uploads_->param(offset); }
  const void* params() override { return uploads_->params(); }
  void before_read(std::size_t group) override { uploads_->before_read(group); }
  void* grad(std::size_t offset) override { return grads_->grad(offset); }
  void complete_from(std::size_t offset) override { grads_->complete_from(offset); }
  // After the last micro-batch's backward: blocks until the step's gradients are on the host
  // (and, with DPU, uploads the previous update). The only host synchronisation of the step.
  GradStats finish_gradients();
  // The step's gradients as CPU Adam reads them (GradientStream::host_grads), after
  // finish_gradients and until the next step begins.
  cpu_adam::ConstArrayView host_grads() const { return grads_->host_grads(); }
  // Starts update number optimizer.state().step + 1 on the Adam thread and returns; every
  // gradient is multiplied by grad_multiplier (1/loss_scale x clip) inside the Adam pass.
  void start_update(float lr, float grad_multiplier);
  // Finishes the running update and its uploads (checkpoints, evaluation, the end of a run).
  void drain() { uploads_->drain(); }
  PhaseTimes phase_times() const { return times_; }

 private:
  dev::Device& dev_;
  dev::Stream& compute_;
  optim::HostOptimizer& opt_;
  EngineConfig cfg_;
  report::Trace* trace_;
  comm::Communicator* comm_;
  BucketPlan plan_;
  std::vector<BucketShard> shards_;  // per bucket: this rank's part (the bucket with one rank)
  std::unique_ptr<comm::StreamComm> grad_comm_, param_comm_;  // on the d2h and h2d streams
  std::unique_ptr<BoundedSync> sync_;
  dev::EventClock clock_;  // device events on the trace's timeline
  bool dpu_ = false;       // this step's update is delayed
  PhaseTimes times_;
  // Declared in this order: the Adam thread (uploads_) stops before the gradients it reads go.
  std::unique_ptr<GradientStream> grads_;
  std::unique_ptr<UploadPipeline> uploads_;
};

}  // namespace zo::offload
