#include "offload/engine.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace zo::offload {

Engine::Engine(dev::Device& device, dev::Stream& compute, const model::ParameterLayout& layout,
               optim::HostOptimizer& optimizer, const EngineConfig& config, report::Trace* trace,
               comm::Communicator* comm)
    : dev_(device),
      compute_(compute),
      opt_(optimizer),
      cfg_(config),
      trace_(trace),
      comm_(comm),
      plan_(engine_bucket_plan(layout, device.act_dtype(), config)),
      shards_(plan_.shards(config.rank, config.ranks)) {
  if (cfg_.grad_accum < 1) throw std::invalid_argument("offload engine: grad_accum must be >= 1");
  if (cfg_.device_slots < 2 || cfg_.host_slots < 1) {
    throw std::invalid_argument("offload engine: need >= 2 device slots and >= 1 host slot");
  }
  const bool parallel = cfg_.ranks > 1;
  if (parallel && (comm_ == nullptr || comm_->size() != cfg_.ranks || comm_->rank() != cfg_.rank)) {
    throw std::invalid_argument("offload engine: config.ranks > 1 needs the job's communicator");
  }
  if (opt_.owned() != owned_ranges(shards_)) {
    throw std::invalid_argument(
        "offload engine: the optimizer does not hold this rank's partition (engine_partition)");
  }
  std::vector<comm::StreamComm*> comms;
  if (parallel) {
    // Gradients and parameters flow on different streams: one communicator each.
    grad_comm_ = comm::make_stream_comm(dev_, *comm_, cfg_.comm_timeout);
    param_comm_ = comm::make_stream_comm(dev_, *comm_, cfg_.comm_timeout);
    comms = {grad_comm_.get(), param_comm_.get()};
  }
  sync_ = std::make_unique<BoundedSync>(dev_, cfg_.rank, cfg_.ranks, cfg_.comm_timeout, comms);
  grads_ = std::make_unique<GradientStream>(dev_, compute_, plan_, shards_, cfg_, grad_comm_.get(),
                                            *sync_);
  uploads_ = std::make_unique<UploadPipeline>(dev_, compute_, layout, opt_, plan_, shards_, cfg_,
                                              param_comm_.get(), *sync_, trace_);
  clock_ = dev::EventClock(dev_, compute_, [this] { return trace_ ? trace_->now_us() : 0.0; });
}

Engine::~Engine() {
  // Data parallel: a collective that never completes would block the teardown of the parts; the
  // streams get the communication timeout, then the collectives are aborted.
  if (cfg_.ranks > 1) {
    for (dev::Stream* s : {&uploads_->stream(), &grads_->stream()}) {
      try {
        (*sync_)(*s, "shutting down");
      } catch (const std::exception&) {
      }
    }
  }
  // The compute stream reads the parameters (forward, backward) and writes the gradient slots:
  // it finishes before the parts free them.
  dev::synchronize_quietly(compute_);
  uploads_.reset();
  grads_.reset();
}

void Engine::begin_step(bool dpu) {
  if (dpu && !cfg_.dpu) throw std::logic_error("offload engine: DPU step without config.dpu");
  uploads_->rethrow_if_failed();
  grads_->begin_step();
  dpu_ = dpu;
}

void Engine::begin_micro_batch(int a) {
  grads_->begin_micro_batch(a);
  // Without DPU the parameters this backward reads are the updated ones: every upload must be
  // enqueued (forward's before_read did it already, group by group).
  uploads_->before_backward();
}

GradStats Engine::finish_gradients() {
  const GradientStream::Stats local = grads_->finish();
  GradStats st{local.sumsq, local.nonfinite};
  if (cfg_.ranks > 1) {  // this rank's shards -> the whole gradient (one small all-reduce)
    double v[2] = {st.sumsq, st.nonfinite ? 1.0 : 0.0};
    comm_->all_reduce(v, 2, comm::ReduceOp::kSum);
    st.sumsq = v[0];
    st.nonfinite = v[1] != 0.0;
    // Every upload enqueued so far is done (this step's forward waited for each group), so this
    // costs nothing; a failed all-gather among them surfaces here.
    (*sync_)(uploads_->stream(), "the parameter all-gather");
  }
  st.nonfinite = st.nonfinite || !std::isfinite(st.sumsq);
  // Before any new upload re-records the upload events the times read.
  const GradientStream::Times g = grads_->times(trace_, clock_);
  const UploadPipeline::Times u = uploads_->times(trace_, clock_);
  times_ = {g.busy, u.adam, u.h2d, g.exposed, u.adam_exposed, u.h2d_exposed};
  // DPU: the previous update is uploaded now, after this backward stopped reading parameters.
  uploads_->after_backward();
  return st;
}

void Engine::start_update(float lr, float grad_multiplier) {
  const std::int64_t t = opt_.state().step + 1;
  uploads_->start(grads_->host_grads(), t, lr, grad_multiplier, dpu_, grads_->backward_done());
  opt_.state().step = t;
}

}  // namespace zo::offload
