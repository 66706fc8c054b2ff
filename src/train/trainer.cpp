// The training loop, written once for every mode: forward and backward per micro-batch, the
// step's one host synchronisation, the loss-scale and clipping decision, the update, metrics,
// evaluation and checkpoints. What differs between resident and offload mode is behind
// train/updater.h; what is set up before the first step is train/session.cpp.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "device/event_clock.h"
#include "device/make_device.h"
#include "pinned_memory/pinned_buffer.h"
#include "report/metrics.h"
#include "report/trace.h"
#include "train/checkpoint_io.h"
#include "train/run_report.h"
#include "train/session.h"
#include "train/stop_request.h"

namespace zo::train {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

Trainer::Trainer(const TrainConfig& config) : impl_(std::make_unique<Session>(config)) {}
Trainer::~Trainer() = default;
const model::ModelSpec& Trainer::spec() const {
  return impl_->spec;
}
int Trainer::rank() const {
  return impl_->rank;
}

TrainSummary Trainer::run(const std::function<void(const std::string&)>& log) {
  Session& S = *impl_;
  const TrainConfig& cfg = S.cfg;
  if (S.finished) {  // a finished run resumed again
    if (log && !cfg.quiet && S.rank == 0) {
      log("nothing to train: the checkpoint " + S.resume_dir.string() + " is at step " +
          std::to_string(S.start_step) + " and --steps " + std::to_string(cfg.steps) +
          " is the step to reach; give a larger --steps to continue the run");
    }
    TrainSummary none;
    none.first_step = S.start_step;
    return none;
  }
  Updater& up = *S.updater;
  model::Model& model = *S.model;
  dev::Device& dev = *S.dev;
  dev::Stream& stream = *S.stream;
  auto say = [&](const std::string& s) {  // rank 0 speaks for the job
    if (log && !cfg.quiet && S.rank == 0) log(s);
  };
  const int B = cfg.micro_batch, T = S.T, A = cfg.grad_accum;
  const std::size_t BT = std::size_t(B) * T;
  // The loss is the mean over the global batch (ranks x A micro-batches x B x T tokens); the
  // reduce-scatter sums the ranks' gradients.
  const std::size_t step_tokens = BT * std::size_t(A) * std::size_t(S.ranks);
  const float dloss_unscaled = 1.0f / float(step_tokens);
  const double fpt = report::flops_per_token(S.layout->size(), S.spec.n_layer,
                                             S.spec.n_head * S.spec.head_size(), T);

  report::MetricsWriter metrics;
  if (!cfg.metrics.empty() && S.rank == 0) {
    metrics = report::MetricsWriter(cfg.metrics, S.start_step > 0, S.run_id);
  }
  say(run_banner(S, step_tokens));

  // Per micro-batch: forward begins, backward begins, backward ends (compute stream).
  std::vector<std::unique_ptr<dev::Event>> events;
  for (int k = 0; k < 3 * A; ++k)
    events.push_back(dev.create_event());
  const dev::EventClock clock(dev, stream, [&] { return S.trace.now_us(); });
  std::vector<std::int32_t> inputs, targets;
  // Page-locked, so that the loss copies stay asynchronous (a pageable copy would wait for the
  // step's kernels and serialise the micro-batches).
  pinned::PinnedBuffer loss_buffer(std::size_t(A) * BT * sizeof(float),
                                   dev::staging_pin_options(dev, true));
  const std::span<float> losses = loss_buffer.span<float>();
  const std::unique_ptr<dev::Event> losses_ready = dev.create_event();
  // On every way out (an error mid-step included) the step's queued copies into loss_buffer end
  // before it is freed; the updater drains its own streams (and this one) before freeing its
  // buffers.
  const dev::StreamDrain drain(stream);

  TrainSummary summary;
  summary.first_step = S.start_step;
  std::int64_t nonfinite_run = 0;  // consecutive steps with Inf/NaN gradients
  bool graph_fallback_said = false;
  double ema_step_ms = 0.0;
  const auto run_t0 = Clock::now();
  std::int64_t run_tokens = 0;
  PhaseTotals totals;
  for (std::int64_t step = S.start_step; step < cfg.steps; ++step) {
    report::ScopedSpan step_span(&S.trace, "main", "step", {{"step", step + 1}});
    // Numbered too, for profilers that select one step by its NVTX range (bench/gpu profile).
    const std::string step_name = "step " + std::to_string(step + 1);
    const report::NvtxRange numbered(step_name.c_str());
    if (S.stall_step && *S.stall_step == step + 1) {
      std::this_thread::sleep_for(std::chrono::duration<double>(4 * cfg.comm_timeout));
      throw std::runtime_error("rank " + std::to_string(S.rank) + " stalled by ZO_TEST_STALL");
    }
    const auto t0 = Clock::now();
    const float lr = cfg.lr.at(step);
    const float scale = S.scaler.scale();
    up.begin_step(cfg.dpu && step >= cfg.dpu_warmup);
    for (int a = 0; a < A; ++a) {
      S.loaders.train->next_batch(inputs, targets);
      model.set_batch(inputs, targets, stream);
      dev.record(*events[3 * a], stream);
      {
        const report::NvtxRange range("forward");  // kernels are enqueued inside it (ncu --nvtx)
        model.forward(up.parameters(), T, true, dloss_unscaled * scale, stream);
      }
      dev.record(*events[3 * a + 1], stream);
      {
        const report::NvtxRange range("backward");
        up.begin_micro_batch(a);
        model.backward(up.parameters(), stream);
      }
      dev.record(*events[3 * a + 2], stream);
      dev.copy_to_host(losses.data() + a * BT, model.losses(), BT * 4, stream);
    }
    dev.record(*losses_ready, stream);
    if (cfg.inject_error_step == step + 1) {
      throw std::runtime_error("an error injected at step " + std::to_string(step + 1) +
                               " (TrainConfig::inject_error_step)");
    }
    const bool injected =
        std::find(cfg.inject_overflow_steps.begin(), cfg.inject_overflow_steps.end(), step + 1) !=
        cfg.inject_overflow_steps.end();
    // The step's one host synchronisation: gradient statistics (the resident update is queued
    // before it), then the losses, copied before.
    const GradStats st = up.finish_gradients({lr, {scale, cfg.grad_clip, injected}});
    losses_ready->synchronize();

    report::StepMetrics m;
    m.step = step + 1;
    m.lr = lr;
    int stop_signal = stop_requested();
    {
      // With several ranks, a signal that reached any of them stops every one after this step.
      double l[3] = {std::accumulate(losses.begin(), losses.end(), 0.0), double(losses.size()),
                     double(stop_signal)};
      if (S.ranks > 1) {
        S.comm->all_reduce(l, 3, comm::ReduceOp::kSum);
        if (stop_signal == 0 && l[2] != 0.0) stop_signal = -1;
      }
      m.loss = l[0] / l[1];
    }
    m.grad_norm = injected || st.nonfinite ? INFINITY : std::sqrt(st.sumsq) / double(scale);
    double fwd = 0, bwd = 0;
    for (int a = 0; a < A; ++a) {
      fwd += events[3 * a + 1]->elapsed_ms_since(*events[3 * a]);
      bwd += events[3 * a + 2]->elapsed_ms_since(*events[3 * a + 1]);
      if (S.trace.enabled()) {
        S.trace.span("compute", "forward", clock.us(*events[3 * a]), clock.us(*events[3 * a + 1]),
                     {{"micro_batch", a}});
        S.trace.span("compute", "backward", clock.us(*events[3 * a + 1]),
                     clock.us(*events[3 * a + 2]), {{"micro_batch", a}});
      }
    }
    // Unscaling and clipping fold into the one multiplier the optimizer applies.
    const StepGate gate = step_gate(st.sumsq, {scale, cfg.grad_clip, injected || st.nonfinite});
    const bool overflow = gate.skip != 0;
    S.scaler.update(overflow);
    m.loss_scale = scale;
    if (overflow) {
      m.skipped = true;  // nothing changes; the scale backs off and the next step retries
      ++summary.skipped_steps;
      ++nonfinite_run;
    } else {
      nonfinite_run = 0;
      up.apply(lr, gate.grad_mult);
    }
    S.tokens += std::int64_t(step_tokens);
    run_tokens += std::int64_t(step_tokens);
    m.tokens = S.tokens;
    m.step_ms = ms_since(t0);
    m.tokens_per_s = double(step_tokens) / (m.step_ms * 1e-3);
    m.tflops = fpt * m.tokens_per_s * 1e-12;
    m.phase_ms = {{"forward", fwd}, {"backward", bwd}};
    up.phase_times(m);
    totals.add(m);

    if (!graph_fallback_said && !model.graph_fallback().empty()) {
      say("CUDA graphs off, forward and backward run kernel by kernel: " + model.graph_fallback());
      graph_fallback_said = true;
    }
    const bool last = step + 1 == cfg.steps;
    if (S.loaders.val && ((cfg.eval_interval > 0 && (step + 1) % cfg.eval_interval == 0) || last)) {
      m.val_loss = S.evaluate();
      summary.final_val_loss = m.val_loss;
    }
    metrics.write(m);
    summary.losses.push_back(m.loss);
    summary.step_ms.push_back(m.step_ms);
    if (summary.steps_done == 0) summary.first_loss = m.loss;
    summary.final_loss = m.loss;
    ++summary.steps_done;
    ema_step_ms = summary.steps_done == 1 ? m.step_ms : 0.9 * ema_step_ms + 0.1 * m.step_ms;
    if ((step + 1) % cfg.log_interval == 0 || last || m.skipped) {
      say(report::progress_line(m, cfg.steps, double(cfg.steps - step - 1) * ema_step_ms * 1e-3));
    }
    if (cfg.max_nonfinite_steps > 0 && nonfinite_run >= cfg.max_nonfinite_steps) {
      summary.stopped = "stopped at step " + std::to_string(step + 1) + ": the last " +
                        std::to_string(nonfinite_run) +
                        " steps had non-finite gradients (Inf/NaN) and were skipped, so training "
                        "is not progressing. Lower --lr, check the data, use bf16 or a smaller "
                        "--loss-scale-max, or raise --max-nonfinite-steps (0 = never stop)";
      summary.exit_status = 1;
      break;  // no checkpoint: nothing changed since the last one but the cursor
    }
    if (stop_signal != 0) {
      summary.stopped = "stopped at step " + std::to_string(step + 1) + " of " +
                        std::to_string(cfg.steps) + " by " +
                        (stop_signal == SIGINT    ? "SIGINT"
                         : stop_signal == SIGTERM ? "SIGTERM"
                                                  : "a stop request");
      summary.exit_status = stop_signal > 0 ? 128 + stop_signal : 1;
    }
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_interval > 0 && (step + 1) % cfg.checkpoint_interval == 0) || last ||
         stop_signal != 0)) {
      const auto dir =
          save_checkpoint(cfg.checkpoint_dir, *S.layout, up.host_state(), S.trainer_state(step + 1),
                          cfg.keep_last, *S.comm, S.partitions);
      summary.last_checkpoint = dir.string();
      say("checkpoint " + dir.string());
    }
    if (stop_signal != 0) {
      if (!summary.last_checkpoint.empty())
        summary.stopped += "; resume from " + summary.last_checkpoint;
      break;
    }
  }
  up.settle();
  stream.synchronize();
  const double run_s = ms_since(run_t0) * 1e-3;
  summary.tokens_per_s = run_s > 0 ? double(run_tokens) / run_s : 0.0;
  say(run_summary(summary, run_s));
  if (summary.steps_done > 0) say(totals.format(summary.steps_done));
  if (S.trace.enabled()) {
    S.trace.write();
    say("trace " + S.trace.path().string() + " (" + std::to_string(S.trace.event_count()) +
        " events; open in https://ui.perfetto.dev)");
  }
  return summary;
}

}  // namespace zo::train
