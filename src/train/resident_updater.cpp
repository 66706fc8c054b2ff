// GPU-resident mode: the whole training state on the device. Gradients go to one flat buffer;
// the step's norm is one device reduction; AdamW is one device launch over the whole layout
// (weight decay differs between runs of tensors: the runs go to it as a table), writing the new
// parameters in act dtype. With several 16-bit micro-batches per step, each micro-batch's
// gradient is added into an fp32 buffer and the sum is rounded once (adding in bf16 would round
// after every micro-batch).
//
// The device decides the step from its own norm (step_gate: clip multiplier or skip), and
// AdamW is enqueued behind it before the host waits for the norm: the device goes from backward
// to the update without idling while the host reads the norm, and the host's work between steps
// (metrics, the next batch) overlaps the update.
#include <chrono>
#include <stdexcept>
#include <string>

#include "device/make_device.h"
#include "pinned_memory/pinned_buffer.h"
#include "train/updater.h"

namespace zo::train {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

class ResidentUpdater final : public Updater {
 public:
  ResidentUpdater(dev::Device& device, dev::Stream& stream, const model::ParameterLayout& layout,
                  optim::HostOptimizer& state, int grad_accum)
      : dev_(device),
        stream_(stream),
        state_(state),
        n_(layout.size()),
        act_(device.act_dtype()),
        params_(device.alloc(n_ * dtype_size(act_), "parameters")),
        grads_(device.alloc(n_ * dtype_size(act_), "gradients")),
        stats_(device.alloc(sizeof(Stats), "gradient norm and step gate")),
        master_(device.alloc(n_ * 4, "fp32 master weights")),
        m_(device.alloc(n_ * 4, "Adam m")),
        v_(device.alloc(n_ * 4, "Adam v")),
        flat_(params_.data(), grads_.data(), act_) {
    // Page-locked, so that the copy stays asynchronous and AdamW is enqueued behind it.
    stats_host_ = pinned::PinnedBuffer(sizeof(Stats), dev::staging_pin_options(device, true));
    if (resident_accumulates_in_f32(act_, grad_accum))
      sum_ = device.alloc(n_ * 4, "fp32 gradient accumulator");
    upload_run_table();
  }
  // Work still queued on the stream reads and writes the buffers: finish it first.
  ~ResidentUpdater() override { dev::synchronize_quietly(stream_); }

  model::ParameterStore& parameters() override { return flat_; }

  // The 16-bit parameters are cast from the master on the device: no host copy of the model.
  void load_state() override {
    const std::size_t bytes = n_ * 4;
    dev_.copy_to_device(master_.data(), state_.master().data(), bytes, stream_);
    if (act_ == DType::kF32) {
      dev_.copy_on_device(params_.data(), master_.data(), bytes, stream_);
    } else {
      dev_.cast(params_.data(), act_, master_.data(), DType::kF32, n_, stream_);
    }
    dev_.copy_to_device(m_.data(), state_.exp_avg().data, bytes, stream_);
    dev_.copy_to_device(v_.data(), state_.exp_avg_sq().data, bytes, stream_);
    stream_.synchronize();  // the host arrays may change right after
  }

  void begin_step(bool) override {
    if (update_pending_)
      throw std::logic_error("resident updater: the device updated a step the trainer skipped");
    dev_.fill_zero(grads_.data(), grads_.bytes(), stream_);
    if (sum_.data()) dev_.fill_zero(sum_.data(), sum_.bytes(), stream_);
  }
  // The previous micro-batch's gradient into the fp32 sum, then a fresh one.
  void begin_micro_batch(int a) override {
    if (!sum_.data() || a == 0) return;
    dev_.accumulate_f32(sum_.as<float>(), grads_.data(), n_, stream_);
    dev_.fill_zero(grads_.data(), grads_.bytes(), stream_);
  }

  GradStats finish_gradients(const StepPlan& plan) override {
    const auto t0 = Clock::now();
    if (sum_.data()) {  // the last micro-batch, then the sum rounded once into the gradient
      dev_.accumulate_f32(sum_.as<float>(), grads_.data(), n_, stream_);
      dev_.cast(grads_.data(), act_, sum_.data(), DType::kF32, n_, stream_);
    }
    auto* stats = stats_.as<Stats>();
    dev_.fill_zero(&stats->sumsq, sizeof(float), stream_);
    dev_.sum_squares(&stats->sumsq, grads_.data(), n_, stream_);
    dev_.step_gate(&stats->gate, &stats->sumsq, plan.gate, stream_);
    dev_.copy_to_host(stats_host_.data(), stats, sizeof(Stats), stream_);
    dev_.record(*stats_ready_, stream_);
    AdamConfig c = state_.config().adam;
    c.lr = plan.lr;
    dev_.adamw(master_.as<float>(), m_.as<float>(), v_.as<float>(), grads_.data(), params_.data(),
               n_, c, state_.state().step + 1, 1.0f, runs_.as<std::uint64_t>(), num_runs_,
               &stats->gate, stream_);
    apply_ms_ = ms_since(t0);
    stats_ready_->synchronize();
    wait_ms_ = ms_since(t0) - apply_ms_;
    const Stats got = *static_cast<const Stats*>(stats_host_.data());
    // The trainer decides from the same norm by the same rule; a difference would leave the
    // step count and the device state apart.
    const StepGate host = step_gate(double(got.sumsq), plan.gate);
    if (host.skip != got.gate.skip || (host.skip == 0 && host.grad_mult != got.gate.grad_mult))
      throw std::logic_error("resident updater: the device's step gate differs from the host's");
    update_pending_ = got.gate.skip == 0;
    return {double(got.sumsq), false};
  }

  // The update is on the device already (finish_gradients); count it.
  void apply(float, float) override {
    if (!update_pending_)
      throw std::logic_error("resident updater: apply for a step the device skipped");
    update_pending_ = false;
    ++state_.state().step;
  }

  void settle() override {}

  optim::HostOptimizer& host_state() override {
    const std::size_t bytes = n_ * 4;
    dev_.copy_to_host(state_.master().data(), master_.data(), bytes, stream_);
    dev_.copy_to_host(state_.exp_avg().data, m_.data(), bytes, stream_);
    dev_.copy_to_host(state_.exp_avg_sq().data, v_.data(), bytes, stream_);
    stream_.synchronize();
    return state_;
  }

  void phase_times(report::StepMetrics& m) const override {
    m.phase_ms["optimizer"] = apply_ms_;
    m.phase_ms["wait"] = wait_ms_;
  }
  std::string describe() const override {
    return "resident mode: AdamW on the device with " +
           std::string(state_format_name(state_.state_format())) + " state";
  }

 private:
  // The weight-decay runs as adamw's table (core/adam.h), on the device for the run.
  void upload_run_table() {
    std::vector<std::uint64_t> starts;
    std::size_t next = 0;
    for (const auto& r : state_.runs()) {
      if (r.begin != next || r.end <= r.begin)
        throw std::logic_error("resident updater: the weight-decay runs do not tile the layout");
      starts.push_back(std::uint64_t(r.begin) | (r.decay ? kAdamRunDecays : 0));
      next = r.end;
    }
    if (next != n_) throw std::logic_error("resident updater: the weight-decay runs end early");
    num_runs_ = static_cast<int>(starts.size());
    runs_ = dev_.alloc(starts.size() * 8, "AdamW run table");
    dev_.copy_to_device(runs_.data(), starts.data(), starts.size() * 8, stream_);
    stream_.synchronize();  // starts goes out of scope
  }

  dev::Device& dev_;
  dev::Stream& stream_;
  optim::HostOptimizer& state_;
  std::size_t n_;
  DType act_;
  // The step's squared gradient norm and the device's decision from it.
  struct Stats {
    float sumsq;
    StepGate gate;
  };
  static_assert(sizeof(Stats) <= 64, "the plan counts 64 bytes (train/plan.cpp)");

  dev::Buffer params_, grads_;  // (n) act dtype each
  dev::Buffer stats_;           // one Stats
  pinned::PinnedBuffer stats_host_;
  std::unique_ptr<dev::Event> stats_ready_ = dev_.create_event();
  bool update_pending_ = false;  // the device applied this step's update; apply counts it
  dev::Buffer master_, m_, v_;   // fp32 (n) each
  dev::Buffer sum_;              // fp32 (n): the step's gradient over micro-batches, or none
  dev::Buffer runs_;             // the weight-decay run table
  int num_runs_ = 0;
  model::FlatParameters flat_;
  double wait_ms_ = 0.0, apply_ms_ = 0.0;
};

}  // namespace

std::unique_ptr<Updater> make_resident_updater(dev::Device& device, dev::Stream& stream,
                                               const model::ParameterLayout& layout,
                                               optim::HostOptimizer& state, int grad_accum) {
  return std::make_unique<ResidentUpdater>(device, stream, layout, state, grad_accum);
}

}  // namespace zo::train
