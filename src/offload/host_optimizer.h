// The host side of training: fp32 master weights and Adam moments in NUMA-placed host memory,
// updated by cpu_adam with per-tensor weight decay (decay and no-decay tensors interleave in the
// forward-order layout, so the update runs over maximal runs of equal decay).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "model/layout.h"
#include "pinned_memory/host_buffer.h"

namespace zo::offload {

struct OptimizerConfig {
  cpu_adam::AdamConfig adam;  // lr is set per step from the schedule
  model::WeightDecayPolicy decay_policy;
  DType state_dtype = DType::kF32;  // m and v: fp32 or bf16
  int threads = 0;                  // 0: all cores
};

class HostOptimizer {
 public:
  HostOptimizer(const model::ParameterLayout& layout, const OptimizerConfig& config);

  std::size_t size() const { return n_; }
  std::span<float> master() { return master_.span<float>(); }
  cpu_adam::ArrayView exp_avg() { return {m_.data(), n_, config_.state_dtype}; }
  cpu_adam::ArrayView exp_avg_sq() { return {v_.data(), n_, config_.state_dtype}; }
  cpu_adam::AdamState& state() { return state_; }
  const OptimizerConfig& config() const { return config_; }

  // One update of every parameter from grads (n, any dtype): t = state().step + 1. If params_out
  // has data, the new params are also written there in its 16-bit dtype.
  cpu_adam::StepResult step(cpu_adam::ConstArrayView grads, float lr, float grad_multiplier,
                            cpu_adam::ArrayView params_out = {});
  // Update number t over layout elements [begin, end) only, without touching state().step: the
  // offload engine updates group by group, every group with the same t. grads and params_out
  // are whole (n) arrays. Call from one thread at a time.
  cpu_adam::StepResult update_range(std::size_t begin, std::size_t end,
                                    cpu_adam::ConstArrayView grads, std::int64_t t, float lr,
                                    float grad_multiplier, cpu_adam::ArrayView params_out = {});

  // Maximal runs of tensors with the same weight-decay setting, in layout order; the
  // GPU-resident mode applies the device AdamW run by run too.
  struct Run {
    std::size_t begin, end;
    bool decay;
  };
  const std::vector<Run>& runs() const { return runs_; }

 private:
  std::size_t n_;
  OptimizerConfig config_;
  cpu_adam::CpuAdam adam_;
  pinned::HostBuffer master_, m_, v_;
  std::vector<Run> runs_;
  cpu_adam::AdamState state_;
};

}  // namespace zo::offload
