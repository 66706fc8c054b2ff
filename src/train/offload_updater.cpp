// Offload mode: the training loop's view of the offload engine (offload/engine.h).
#include <string>

#include "cpu_adam/cpu_adam.h"
#include "offload/engine.h"
#include "train/updater.h"

namespace zo::train {
namespace {

class OffloadUpdater final : public Updater {
 public:
  OffloadUpdater(dev::Device& device, dev::Stream& stream, const model::ParameterLayout& layout,
                 optim::HostOptimizer& state, const offload::EngineConfig& config,
                 report::Trace* trace, comm::Communicator* comm)
      : state_(state),
        grad_accum_(config.grad_accum),
        on_device_(config.accumulate_on_device),
        window_(config.param_window),
        engine_(device, stream, layout, state, config, trace, comm) {}

  model::ParameterStore& parameters() override { return engine_; }
  void load_state() override { engine_.upload_all(); }
  void begin_step(bool dpu) override { engine_.begin_step(dpu); }
  void begin_micro_batch(int a) override { engine_.begin_micro_batch(a); }
  // CPU Adam needs the norm first (the update starts on the host, in apply).
  GradStats finish_gradients(const StepPlan&) override {
    const offload::GradStats s = engine_.finish_gradients();
    return {s.sumsq, s.nonfinite};
  }
  // Runs on the Adam thread, overlapping what follows.
  void apply(float lr, float grad_multiplier) override {
    engine_.start_update(lr, grad_multiplier);
  }
  void settle() override { engine_.drain(); }
  optim::HostOptimizer& host_state() override {
    engine_.drain();
    return state_;
  }

  void phase_times(report::StepMetrics& m) const override {
    const offload::PhaseTimes p = engine_.phase_times();
    m.phase_ms["d2h"] = p.d2h;
    m.phase_ms["adam"] = p.adam;
    m.phase_ms["h2d"] = p.h2d;
    m.exposed_ms = {{"d2h", p.d2h_exposed}, {"adam", p.adam_exposed}, {"h2d", p.h2d_exposed}};
  }
  std::string describe() const override {
    std::string s = std::string(window_ > 0 ? "stream" : "offload") + " mode: AdamW on the CPU (" +
                    std::string(cpu_adam::isa_name(cpu_adam::default_isa())) + ") with " +
                    std::string(state_format_name(state_.state_format())) + " state";
    if (grad_accum_ > 1) {
      s += on_device_ ? "; micro-batches summed in fp32 on the device, one bucket per step to "
                        "the host"
                      : "; every micro-batch's buckets to the host, summed there in fp32";
    }
    if (window_ > 0) {
      s += "; " + std::to_string(window_) +
           " blocks on the device at a time, copied in ahead of "
           "each pass";
    }
    return s;
  }

 private:
  optim::HostOptimizer& state_;
  int grad_accum_;
  bool on_device_;
  int window_;
  offload::Engine engine_;
};

}  // namespace

std::unique_ptr<Updater> make_offload_updater(dev::Device& device, dev::Stream& stream,
                                              const model::ParameterLayout& layout,
                                              optim::HostOptimizer& state,
                                              const offload::EngineConfig& config,
                                              report::Trace* trace, comm::Communicator* comm) {
  return std::make_unique<OffloadUpdater>(device, stream, layout, state, config, trace, comm);
}

}  // namespace zo::train
