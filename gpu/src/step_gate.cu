// The step's gate on the device: core/adam.h's step_gate (the training loop's own rule) run by one
// thread on the gradient norm the reduction left in device memory, so that the resident step
// enqueues AdamW behind it without waiting for the host to read the norm.
#include "core/adam.h"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

__global__ void step_gate_kernel(StepGate* gate, const float* sumsq, StepGateRule rule) {
  *gate = step_gate(static_cast<double>(*sumsq), rule);
}

void launch_step_gate(StepGate* gate, const float* sumsq, const StepGateRule& rule,
                      cudaStream_t s) {
  detail::check_not_null("launch_step_gate", {{gate, "gate"}, {sumsq, "sumsq"}});
  ZO_LAUNCH(1, 1, 0, s, step_gate_kernel)(gate, sumsq, rule);
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace zo::gpu
