#include "train/host_optimizer.h"

#include <stdexcept>

namespace zo::train {
namespace {

cpu_adam::CpuAdam::Options adam_options(int threads) {
  cpu_adam::CpuAdam::Options o;
  o.threads = threads;
  return o;
}

cpu_adam::ArrayView slice(cpu_adam::ArrayView a, std::size_t b, std::size_t e) {
  if (a.data == nullptr) return a;
  return {static_cast<char*>(a.data) + b * dtype_size(a.dtype), e - b, a.dtype};
}

cpu_adam::ConstArrayView slice(cpu_adam::ConstArrayView a, std::size_t b, std::size_t e) {
  return {static_cast<const char*>(a.data) + b * dtype_size(a.dtype), e - b, a.dtype};
}

}  // namespace

HostOptimizer::HostOptimizer(const model::ParameterLayout& layout, const OptimizerConfig& config)
    : n_(layout.size()), config_(config), adam_(config.adam, adam_options(config.threads)) {
  if (config.state_dtype != DType::kF32 && config.state_dtype != DType::kBF16) {
    throw std::invalid_argument("--optimizer-state must be fp32 or bf16");
  }
  const std::size_t state_bytes = dtype_size(config.state_dtype);
  // First touch in the optimizer's own threads so pages sit on the updating thread's node.
  adam_.execute([&] {
    master_ = pinned::HostBuffer::allocate_array<float>(n_, {}, cpu_adam::kChunkElements);
    m_ = pinned::HostBuffer(n_ * state_bytes);
    v_ = pinned::HostBuffer(n_ * state_bytes);
    m_.first_touch(cpu_adam::kChunkElements * state_bytes);
    v_.first_touch(cpu_adam::kChunkElements * state_bytes);
  });
  for (const auto& t : layout.tensors()) {
    const bool decay = config.decay_policy.applies_to(t);
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().end == t.offset) {
      runs_.back().end = t.offset + t.numel;
    } else {
      runs_.push_back({t.offset, t.offset + t.numel, decay});
    }
  }
}

cpu_adam::StepResult HostOptimizer::step(cpu_adam::ConstArrayView grads, float lr,
                                         float grad_multiplier, cpu_adam::ArrayView params_out) {
  if (grads.size != n_) throw std::invalid_argument("HostOptimizer::step: gradient size mismatch");
  const std::int64_t t = state_.step + 1;
  cpu_adam::StepResult result{false, true};
  for (const Run& r : runs_) {
    cpu_adam::AdamConfig c = config_.adam;
    c.lr = lr;
    if (!r.decay) c.weight_decay = 0.0f;
    adam_.set_config(c);
    cpu_adam::AdamBuffers b;
    b.params = master().subspan(r.begin, r.end - r.begin);
    b.exp_avg = slice(exp_avg(), r.begin, r.end);
    b.exp_avg_sq = slice(exp_avg_sq(), r.begin, r.end);
    b.grads = slice(grads, r.begin, r.end);
    b.params_out = slice(params_out, r.begin, r.end);
    const auto rr = adam_.update(b, t, {grad_multiplier, cpu_adam::NonFinitePolicy::kReport});
    result.found_nonfinite = result.found_nonfinite || rr.found_nonfinite;
  }
  state_.step = t;
  return result;
}

}  // namespace zo::train
