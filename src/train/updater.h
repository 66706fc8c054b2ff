// How one optimizer step turns the model's gradients into new parameters. The training loop is
// written once against this interface (train/trainer.cpp); two implementations:
// - resident (resident_updater.cpp): gradients in one flat device buffer, AdamW on the device
//   over fp32 master, m and v kept there;
// - offload (offload_updater.cpp): the offload engine (offload/engine.h): gradient buckets
//   streamed to the host during backward, CPU Adam, per-group uploads, optionally DPU.
// Both work on the same host optimizer state (optim::HostOptimizer), which is what checkpoints
// save and load; the resident updater uses it only as staging.
#pragma once

#include <memory>
#include <string>

#include "comm/comm.h"
#include "device/device.h"
#include "model/layout.h"
#include "model/model.h"
#include "offload/engine_config.h"
#include "optim/host_optimizer.h"
#include "report/metrics.h"
#include "report/trace.h"

namespace zo::train {

struct GradStats {
  double sumsq = 0.0;      // squared L2 norm of the (loss-scaled) step gradient, all ranks
  bool nonfinite = false;  // some gradient was Inf or NaN
};

// How the step's update goes, known before its gradient norm: the learning rate, and the rule
// (core/adam.h step_gate) by which the norm gives the gradient multiplier or a skip.
struct StepPlan {
  float lr = 0.0f;
  StepGateRule gate;
};

class Updater {
 public:
  virtual ~Updater() = default;
  // What forward reads and backward writes.
  virtual model::ParameterStore& parameters() = 0;
  // The host state changed (initialisation, resume): put it on the device. Waits.
  virtual void load_state() = 0;

  // ---- one step: begin_step, per micro-batch begin_micro_batch (before its backward),
  // finish_gradients (the step's host synchronisation), then apply unless
  // step_gate(stats.sumsq, plan.gate) skips the step (or stats.nonfinite).
  virtual void begin_step(bool dpu) = 0;  // dpu: this step's update may overlap the next step
  virtual void begin_micro_batch(int a) = 0;
  // Returns once the gradient statistics are on the host. An updater that decides on the device
  // (resident) enqueues the update by `plan` before it waits, so that the device runs AdamW
  // while the host reads the norm; the host's own step_gate then decides the same. Such an
  // updater reports an Inf/NaN gradient through sumsq only (nonfinite stays false), since the
  // device's gate sees nothing else.
  virtual GradStats finish_gradients(const StepPlan& plan) = 0;
  // Update number state().step + 1 with learning rate lr; every gradient is multiplied by
  // grad_multiplier (1/loss_scale x clip coefficient). May run on after it returns. Where
  // finish_gradients enqueued the update, this counts it.
  virtual void apply(float lr, float grad_multiplier) = 0;
  // The device parameters hold every applied update (evaluation, the end of a run).
  virtual void settle() = 0;
  // Settled, and the host state holds master, m and v as the device has them (checkpoints).
  virtual optim::HostOptimizer& host_state() = 0;

  // The last step's busy and exposed times besides forward and backward (ms), for the
  // progress line and metrics; and one line saying how updates run.
  virtual void phase_times(report::StepMetrics& m) const = 0;
  virtual std::string describe() const = 0;
};

// AdamW on the device; `state` is the host staging of master, m and v (fp32 state only). With
// several micro-batches per step and 16-bit gradients, they are summed in an fp32 buffer
// (resident_accumulates_in_f32; the planner counts it) and rounded once.
std::unique_ptr<Updater> make_resident_updater(dev::Device& device, dev::Stream& stream,
                                               const model::ParameterLayout& layout,
                                               optim::HostOptimizer& state, int grad_accum);
inline bool resident_accumulates_in_f32(DType act, int grad_accum) {
  return act != DType::kF32 && grad_accum > 1;
}

// The offload engine over `state` (this rank's partition with several ranks).
std::unique_ptr<Updater> make_offload_updater(dev::Device& device, dev::Stream& stream,
                                              const model::ParameterLayout& layout,
                                              optim::HostOptimizer& state,
                                              const offload::EngineConfig& config,
                                              report::Trace* trace, comm::Communicator* comm);

}  // namespace zo::train
