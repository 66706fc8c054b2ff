// Adam / AdamW hyperparameters and the per-step constants every implementation derives from them
// (cpu_adam on the host, the GPU AdamW kernel, the host backend's device AdamW), written once so
// that all of them round identically. Plain C++17: nvcc includes it too.
//
// Adam: Kingma & Ba, arXiv 1412.6980. AdamW (decoupled weight decay): arXiv 1711.05101,
// Algorithm 2. Per element, with g = grad * grad_multiplier:
//   g  += l2 * p                                      (L2-style Adam only)
//   m   = b1 * m + (1 - b1) * g
//   v   = b2 * v + (1 - b2) * g^2
//   p   = p * (1 - lr * wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cmath>
#include <cstdint>

// Functions the host and CUDA kernels both call (nvcc compiles them for both sides).
#if defined(__CUDACC__)
#define ZO_HOST_DEVICE __host__ __device__
#else
#define ZO_HOST_DEVICE
#endif

namespace zo {

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  // AdamW; false adds weight_decay * p to the gradient (L2)
  bool bias_correction = true;

  // Throws std::invalid_argument "<who>: <field> = <value> ..." naming the bad field and what is
  // allowed: lr and weight_decay finite and >= 0, betas in [0, 1), eps finite and > 0.
  void validate(const char* who) const;
};

// Step numbers count from 1; the gradient multiplier (1/loss_scale x clip) is finite and >= 0.
// Throws std::invalid_argument naming `who` otherwise.
void check_adam_step(const char* who, std::int64_t t, float grad_multiplier);

// The constants of update number t, computed in double and rounded to float once per call; every
// element then runs the same float operations in the same order (docs/cpu_adam.md).
struct AdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float neg_step_size;  // -lr / (1 - beta1^t), or -lr without bias correction
  float bc2_rsqrt;      // 1 / sqrt(1 - beta2^t), or 1 without bias correction
  float eps;
  float decay;      // 1 - lr * weight_decay for AdamW, else 1
  float l2;         // weight_decay for L2-style Adam, else 0
  float grad_mult;  // 1/loss_scale x clip coefficient
};
AdamScalars adam_scalars(const AdamConfig& c, std::int64_t t, float grad_multiplier);

// What a step does with its gradient, decided from the squared L2 norm of the loss-scaled
// gradient: unscale it, clip the norm to max_norm (0: no clipping; the 1e-6 guards the division,
// as torch.nn.utils.clip_grad_norm_ does), or skip the update when the norm is not finite (an
// fp16 overflow) or the step is marked to skip. Written once for the training loop and for the
// device, which decides before the host has seen the norm (resident mode), so that both decide
// alike bit for bit.
struct StepGateRule {
  float loss_scale = 1.0f;  // the scale the step's backward ran with
  float max_norm = 0.0f;    // --grad-clip
  bool force_skip = false;  // skip whatever the norm (the overflow-injection test hook)
};
struct StepGate {
  float grad_mult;     // 1/loss_scale x clip coefficient: AdamW's gradient multiplier
  std::uint32_t skip;  // nonzero: no update this step
};
ZO_HOST_DEVICE inline StepGate step_gate(double sumsq, const StepGateRule& r) {
  const double norm = ::sqrt(sumsq) / static_cast<double>(r.loss_scale);
  const bool finite = norm - norm == 0.0;  // false for Inf and NaN
  if (r.force_skip || !finite) return {0.0f, 1};
  const float clip = r.max_norm > 0.0f && norm > r.max_norm
                         ? static_cast<float>(static_cast<double>(r.max_norm) / (norm + 1e-6))
                         : 1.0f;
  return {clip / r.loss_scale, 0};
}

// A weight-decay run table, for one AdamW launch over a whole layout: entry r is the first
// element of run r, ascending from 0, with kAdamRunDecays set where weight decay applies; run r
// ends where run r + 1 starts, the last at the array's end.
inline constexpr std::uint64_t kAdamRunDecays = std::uint64_t{1} << 63;

}  // namespace zo
